"""The MySQL/MariaDB store's connection.

- Its URL is read here.
- It is opened on first use.
- It is set up in one round trip: the session settings and the look at the schema.
  A run's acquire takes the session settings along in its own query instead.
- Every call is bounded by the I/O timeout.
  That means socket timeouts, and the server's statement and lock-wait timeouts.
- Failures are mapped to tasklock errors.
- A broken connection is dropped, and the next call is made on a new one.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
from collections.abc import Callable
from collections.abc import Iterator

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.mysql.driver import CLIENT
from tasklock_cli.stores.mysql.driver import charset_by_name
from tasklock_cli.stores.mysql.driver import enable_ssl
from tasklock_cli.stores.mysql.driver import pymysql
from tasklock_cli.stores.mysql.schema import INSPECT
from tasklock_cli.stores.mysql.schema import MySQLSchema
from tasklock_cli.stores.sql import SqlConnection
from tasklock_cli.stores.urls import check_host
from tasklock_cli.stores.urls import query_parameters
from tasklock_cli.stores.urls import split_url
from tasklock_cli.stores.urls import unknown_parameter
from tasklock_cli.stores.urls import unquote
from tasklock_cli.stores.urls import url_passwords
from tasklock_cli.util.numbers import decimal

DEFAULT_PORT = 3306
DEFAULT_TABLE = "tasklock_leases"
#: Deadlocks (1213) and lock wait timeouts (1205) are retried this often.
CONFLICT_RETRIES = 5
_DEADLOCK = 1213
_LOCK_WAIT_TIMEOUT = 1205
#: The server answered and refused: fix the URL, the grants or the server (78, not 69).
_CONFIG_CODES = {
    1044,  # access denied to the database
    1045,  # access denied (user, password)
    1049,  # unknown database
    1142,  # command denied on a table
    1143,  # column access denied
    1370,  # EXECUTE/ALTER ROUTINE denied
    1227,  # needs a privilege (SUPER, ...)
    1251,  # the client does not support the server's authentication protocol
    1698,  # access denied (auth plugin)
}
#: The statement overran the server-side limit we set (MariaDB, MySQL).
_STATEMENT_TIMEOUT_CODES = {1969, 3024}
#: The connection is gone (client-side codes) or the server is going away.
_CONNECTION_CODES = {2003, 2006, 2013, 2014, 2055, 1053, 1077, 1927}
NO_SUCH_TABLE = 1146
_TABLE_MISSING = {NO_SUCH_TABLE, 1305}  # table, procedure
_PARAMETERS = ("table", "unix_socket", "ssl_ca", "ssl_cert", "ssl_key")
_SQL_MODE = "STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ENGINE_SUBSTITUTION"

#: typing costs ~2 ms per start (PyMySQL does without it): its names are for the type
#: checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any
    from typing import TypeVar

    _T = TypeVar("_T")


class _Connection(pymysql.connections.Connection):
    """PyMySQL's connection, without three of its costs.

    - No SET NAMES round trip of its own at connect.
      Ours goes in the set-up query, with the other session settings.
    - No loading of the system's CA certificates for a TLS context that verifies nothing.
    - No loading of ``ssl`` until TLS is used (see ``driver``)."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("ssl"):
            enable_ssl()
        try:
            super().__init__(**kwargs, defer_connect=True)
        except OSError as exc:  # the TLS files (ssl.SSLError is one): no retry makes them
            raise ConfigError(
                f"cannot load the TLS files of ssl_ca=/ssl_cert=/ssl_key=: {exc}"
            ) from None
        if not self.ssl:  # type: ignore[has-type]  # (PyMySQL's attribute, untyped)
            # PyMySQL without ssl: its "preferred" TLS, made if the server offers TLS.
            self.ssl, self._ssl_required, self.ctx = True, False, _PreferredTLS(self)
        self.connect(None if self.unix_socket else self._tcp_socket())

    def _tcp_socket(self) -> socket.socket:
        """The TCP connection PyMySQL's ``connect`` would make, set up as it sets it up.

        The look-up gets an ASCII host name as bytes: Python's resolver encodes a str with
        the ``idna`` codec, whose import (encodings.idna, stringprep, unicodedata) is ~5 M
        instructions of every start."""
        host = self.host.encode("ascii") if self.host.isascii() else self.host
        try:
            sock = socket.create_connection((host, self.port), self.connect_timeout)
        except OSError as exc:  # as PyMySQL's connect words it
            raise pymysql.err.OperationalError(
                2003, f"Can't connect to MySQL server on {self.host!r} ({exc})"
            ) from None
        self.host_info = f"socket {self.host}:{self.port}"
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return sock

    def set_character_set(self, charset: str, collation: str | None = None) -> None:
        self.encoding = charset_by_name(charset).encoding
        self.charset, self.collation = charset, collation

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        """Without a CA (PyMySQL's "preferred" TLS, or ``ssl_cert=`` alone) the server's
        certificate is not verified, so the ~30 ms load of the system's CAs that
        ``ssl.create_default_context`` does buys nothing."""
        unverified = (
            isinstance(sslp, dict)
            and sslp.get("ca") is None
            and sslp.get("capath") is None
            and sslp.get("verify_mode") is None
        )
        if not unverified:
            return super()._create_ssl_ctx(sslp)
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if "cert" in sslp:
            ctx.load_cert_chain(sslp["cert"], keyfile=sslp.get("key"))
        return ctx


class _PreferredTLS:
    """PyMySQL's "preferred" TLS context (used when the server offers TLS, else plain TCP),
    made, and ``ssl`` loaded, only when the handshake wraps the socket."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    def wrap_socket(self, sock: Any, server_hostname: str | None = None) -> Any:
        enable_ssl()
        ctx = self._connection.ctx = self._connection._create_ssl_ctx({})
        return ctx.wrap_socket(sock, server_hostname=server_hostname)


def parse_url(url: str, display_url: str) -> tuple[dict[str, Any], str]:
    """``(PyMySQL's connect arguments, the table)`` from ``mysql://USER[:PASSWORD]@HOST
    [:PORT]/DB[?table=NAME&...]``; ConfigError naming what is wrong."""
    scheme, netloc, path, query = split_url(url)
    userinfo, _, hostport = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    host, port = hostport, DEFAULT_PORT
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":"):
            port = _port(rest[1:], display_url)
    elif ":" in hostport:
        host, _, text = hostport.rpartition(":")
        port = _port(text, display_url)
    check_host("MySQL", url, unquote(host))
    database = unquote(path.lstrip("/"))
    if not database or "/" in database:
        raise ConfigError(
            f"MySQL store URL {display_url!r} names no database "
            f"(expected {scheme}://USER[:PASSWORD]@HOST[:PORT]/DB)"
        )
    params = query_parameters(query)
    for name in params:
        if name not in _PARAMETERS:
            raise unknown_parameter("MySQL", url, name, ", ".join(f"{p}=" for p in _PARAMETERS))
    table = params.pop("table", DEFAULT_TABLE)
    ssl = {name[4:]: value for name, value in params.items() if name.startswith("ssl_")}
    kwargs: dict[str, Any] = {
        "host": unquote(host) or "127.0.0.1",
        "port": port,
        "user": unquote(user) or None,
        "password": unquote(password),
        "database": database,
    }
    if "unix_socket" in params:
        kwargs["unix_socket"] = params["unix_socket"]
    if ssl:
        kwargs["ssl"] = ssl
    return kwargs, table


def _port(text: str, display_url: str) -> int:
    port = decimal(text, 1, 65535)
    if port is None:
        raise ConfigError(f"invalid port {text!r} in the store URL {display_url!r}")
    return port


class MySQLConnection(SqlConnection):
    """The store's one connection, used under ``lock`` through ``run``."""

    current: pymysql.connections.Connection | None

    def __init__(self, url: str, display_url: str, schema: MySQLSchema, kwargs: dict) -> None:
        super().__init__(display_url, url_passwords(url) | {kwargs["password"]} - {""})
        self.schema = schema
        self._kwargs = kwargs
        self.mariadb = True
        self.inspected: tuple = ()
        #: The session settings a new connection has not had yet: the first call sends
        #: them in its own query (``run``'s ``set_up_in_band``, ``take_set_up``).
        self._pending_set_up = ""

    @property
    def database(self) -> str:
        return self._kwargs["database"]

    def connect(self) -> pymysql.connections.Connection:
        """A new autocommit connection, close-on-exec (Python's sockets are), set up (the
        session settings) but without a look at the schema: a break watch's own."""
        conn = self._connect()
        try:
            self._set_limits(conn, self.io_timeout)
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect(self) -> pymysql.connections.Connection:
        io = self.io_timeout
        return _Connection(
            **self._kwargs,
            charset="utf8mb4",
            autocommit=True,
            client_flag=CLIENT.MULTI_STATEMENTS,
            connect_timeout=max(1.0, io),
            read_timeout=io + 0.05,
            write_timeout=io + 0.05,
            program_name="tasklock",
        )

    def _setup(self, io: float | None = None) -> str:
        """The session settings, one multi-statement query: UTC (SYSDATE(6) gives UTC
        times), READ COMMITTED, a known sql_mode (backslash escapes on: PyMySQL quotes
        with them), and statements and lock waits bounded by the I/O timeout (``io``,
        else the connection's)."""
        io = self.io_timeout if io is None else io
        limit = (
            f"max_statement_time = {io * 0.8:.3f}"
            if self.mariadb
            else f"max_execution_time = {max(1, int(io * 800))}"
        )
        return (
            "SET NAMES utf8mb4;"
            f" SET SESSION time_zone = '+00:00', SESSION sql_mode = '{_SQL_MODE}',"
            f" SESSION innodb_lock_wait_timeout = {max(1, math.ceil(io * 0.8))}, SESSION {limit};"
            " SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
        )

    def _open(self) -> pymysql.connections.Connection:
        """A new connection, set up and its schema looked at in one round trip."""
        conn = self._connect()
        try:
            self.mariadb = "mariadb" in conn.get_server_info().lower()
            with conn.cursor() as cursor:
                cursor.execute(self._setup() + ";" + INSPECT, self.schema.inspection_params())
                while cursor.nextset():
                    if cursor.description is not None:
                        self.inspected = tuple(cursor.fetchall())
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_without_set_up(self) -> pymysql.connections.Connection:
        """A new connection whose session settings go with its first call (see ``run``)."""
        self.drop()
        conn = self.current = self._connect()
        self.mariadb = "mariadb" in conn.get_server_info().lower()
        self._pending_set_up = self._setup() + ";"
        self._applied_timeout = self.io_timeout
        return conn

    def take_set_up(self) -> str:
        """What a call sends before its statement, in the same query: the session settings
        of a connection that has not had them (``run``'s ``set_up_in_band``), else ""."""
        set_up, self._pending_set_up = self._pending_set_up, ""
        return set_up

    def _session_ended(self) -> None:
        super()._session_ended()
        self._pending_set_up = ""

    def _connection(self, ensure_schema: bool) -> pymysql.connections.Connection:
        conn = self.current
        if conn is None or not conn.open:
            self.drop()
            conn = self.current = self._open()
            self._applied_timeout = self.io_timeout
        if self._applied_timeout != self.io_timeout:
            self._set_limits(conn, self.io_timeout)
            self._applied_timeout = self.io_timeout
        if ensure_schema and not self._schema_ok:
            if self.schema.judge(self.inspected) != "ok":
                self._create(conn)
            self._schema_confirmed()
        return conn

    def _create(self, conn: pymysql.connections.Connection) -> None:
        """Create what is missing under the schema's named lock: racing first users
        queue on it, and the second finds everything done. It may take ``schema_timeout``
        (``_patient``), and never goes on without the lock."""
        patience = self.schema_timeout()
        # Within the session's statement limit (0.8 of it), which would end the wait early.
        wait = round(patience * 0.7, 3)
        with self._patient(conn, patience), conn.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK(%s, %s)", (self.schema.lock_name(), wait))
            row = cursor.fetchone()
            if row is None or row[0] != 1:
                raise StoreUnavailable(
                    f"{self.display_url}: another client has been making table "
                    f"{self.schema.table_name} and its procedures for {wait:g} s"
                    if row is not None and row[0] == 0
                    else f"{self.display_url}: the wait for the lock on making table "
                    f"{self.schema.table_name} was ended by the server"
                )
            try:
                cursor.execute(INSPECT, self.schema.inspection_params())
                if self.schema.judge(cursor.fetchall()) == "ok":
                    return
                for statement in self.schema.statements():
                    cursor.execute(statement)
            except pymysql.err.MySQLError as exc:
                if error_code(exc) in _CONFIG_CODES:
                    raise ConfigError(
                        f"{self.display_url}: table {self.schema.table_name} or its procedures "
                        f"are missing and cannot be created ({self.scrub(str(exc))}); have a "
                        "DBA run the output of `tasklock init --print-sql`"
                    ) from None
                raise
            finally:
                with contextlib.suppress(pymysql.err.MySQLError):
                    cursor.execute("DO RELEASE_LOCK(%s)", (self.schema.lock_name(),))

    @contextlib.contextmanager
    def _patient(self, conn: pymysql.connections.Connection, seconds: float) -> Iterator[None]:
        """Within: the socket's timeouts and the session's statement and lock wait limits
        are ``seconds``; after, the I/O timeout's again (a round trip each way, when they
        differ). Where that fails, or the block does, the connection is closed (its limits
        are the long ones): the next call opens another, and the block's error stands."""
        io = self.io_timeout
        if seconds == io:
            yield
            return
        try:
            self._set_limits(conn, seconds)
            yield
            self._set_limits(conn, io)
        except BaseException:
            self.drop()
            raise

    def _set_limits(self, conn: pymysql.connections.Connection, seconds: float) -> None:
        """The socket's timeouts and the session's settings (``_setup``) for ``seconds``."""
        conn._read_timeout = conn._write_timeout = seconds + 0.05
        with conn.cursor() as cursor:
            cursor.execute(self._setup(seconds))
            while cursor.nextset():
                pass

    def run(
        self,
        operation: Callable[[pymysql.connections.Connection], _T],
        *,
        idempotent: bool = True,
        ensure_schema: bool = True,
        set_up_in_band: bool = False,
    ) -> _T:
        """Run ``operation`` on the connection, mapping every failure to a tasklock error.

        ``set_up_in_band`` (an idempotent call: a run's acquire): a new connection is not
        set up, nor its schema looked at, in a round trip of their own. The operation sends
        the session settings (``take_set_up``) in its own query, and the schema is taken as
        it is: a call that fails (a procedure missing or of other parameters: 1305, 1318;
        a table missing) is made again on a connection set up as usual, whose look at the
        schema creates or replaces what is missing.

        Retried here:

        - deadlocks and lock wait timeouts, a few times (the procedures roll back first);
        - a table or procedure that vanished, recreated once;
        - a connection found broken when reused, once, on a new one.
          A non-idempotent call is retried only when it failed before it was sent."""
        with self.lock:
            if (
                set_up_in_band
                and idempotent
                and not (self.current is not None and self.current.open)
            ):
                with contextlib.suppress(_CallAgain):
                    return self._first_call_in_band(operation)
            conflicts = 0
            reconnected = recreated = False
            while True:
                stale = self.current is not None and self.current.open
                try:
                    conn = self._connection(ensure_schema)
                    return operation(conn)
                except pymysql.err.MySQLError as exc:
                    code = error_code(exc)
                    if code in (_DEADLOCK, _LOCK_WAIT_TIMEOUT):
                        conflicts += 1
                        if conflicts > CONFLICT_RETRIES:
                            raise self._translate(exc) from None
                        time.sleep(_jitter() * conflicts)
                    elif code in _TABLE_MISSING and not recreated:
                        self._schema_ok, self.inspected, recreated = False, (), True
                    elif self._broken(exc) and stale and not reconnected and idempotent:
                        self.drop()
                        reconnected = True
                    else:
                        if self._broken(exc):
                            self.drop()
                        raise self._translate(exc) from None
                except OSError as exc:
                    self.drop()
                    raise StoreUnavailable(f"{self.display_url}: {self.scrub(str(exc))}") from None

    def _first_call_in_band(self, operation: Callable[[pymysql.connections.Connection], _T]) -> _T:
        """``operation`` on a new connection that it sets up itself (``run``); _CallAgain
        when the call failed, not the connection."""
        try:
            conn = self._open_without_set_up()
            result = operation(conn)
        except pymysql.err.MySQLError as exc:
            broken = self._broken(exc)
            self.drop()
            if broken:  # (a new connection's failure: not retried, as in run)
                raise self._translate(exc) from None
            raise _CallAgain() from None
        except OSError as exc:
            self.drop()
            raise StoreUnavailable(f"{self.display_url}: {self.scrub(str(exc))}") from None
        if self._pending_set_up:  # never: the operation sends it
            self.drop()
            raise AssertionError("the session settings were not sent")
        self._schema_confirmed()  # (the call found what it needed)
        return result

    def _broken(self, exc: Exception) -> bool:
        current = self.current
        return (
            isinstance(exc, pymysql.err.InterfaceError)
            or error_code(exc) in _CONNECTION_CODES
            or current is None
            or not current.open
        )

    def _translate(self, exc: Exception) -> TasklockError:
        code = error_code(exc)
        text = self.scrub(str(exc.args[1] if len(exc.args) > 1 else exc)) or type(exc).__name__
        where = self.display_url
        if code in _CONFIG_CODES:
            return ConfigError(f"{where}: the server refused: {text} ({code})")
        if code in _STATEMENT_TIMEOUT_CODES:
            return StoreUnavailable(
                f"{where}: the statement did not finish within {self.io_timeout:g} s ({text})"
            )
        if code in (1290, 1836):  # --read-only
            return StoreUnavailable(f"{where}: the server is read-only ({text})")
        if code in _TABLE_MISSING:
            return ConfigError(f"{where}: table {self.schema.table_name} is unusable ({text})")
        if isinstance(exc, pymysql.err.ProgrammingError):
            return ConfigError(f"{where}: table {self.schema.table_name} is unusable ({text})")
        return StoreUnavailable(f"{where}: {text}")


class _CallAgain(Exception):
    """A first call that set up its own session failed: again, on a connection set up as
    usual."""


def _jitter() -> float:
    """1 to 5 ms, at random (without ``random``'s import)."""
    return 0.001 + int.from_bytes(os.urandom(2), "big") / 65536 * 0.004


def error_code(exc: BaseException) -> int:
    """The server's (or PyMySQL's) error number of ``exc``; 0 when it has none."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else 0
