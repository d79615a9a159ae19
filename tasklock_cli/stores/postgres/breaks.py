"""How a PostgreSQL holder hears that its lease was broken.

- A break or forced release ``pg_notify``s the key's break channel, in its statement.
- The payload is the fencing token.
- The holder LISTENs on the channel on a connection of its own, which it selects on.
- There is one such connection per lease, kept until its release (see ``BreakWatches``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg import sql

from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.postgres.connection import Overrun
from tasklock_cli.stores.postgres.connection import PgConnection
from tasklock_cli.stores.postgres.connection import Watchdog
from tasklock_cli.stores.postgres.schema import PgSchema
from tasklock_cli.stores.watches import SocketBreakWatch

try:  # the built-in MD5: hashlib would load OpenSSL (3-5 ms of every run)
    from _md5 import md5
except ImportError:  # pragma: no cover - a Python built without it
    from hashlib import md5

_T = TypeVar("_T")


class BreakListener(SocketBreakWatch):
    """A holder's own connection, LISTENing on its lease's break channel."""

    def __init__(self, conn: psycopg.Connection, payload: str, io_timeout: float) -> None:
        super().__init__()
        self.conn = conn
        self.payload = payload
        self.io_timeout = io_timeout
        self._watchdog = Watchdog()

    def guarded(self, operation: Callable[[], _T]) -> _T:
        """Run ``operation`` on the connection, shut down if it overruns the I/O timeout."""
        self._watchdog.arm(self.conn.fileno(), self.io_timeout)
        try:
            return operation()
        finally:
            if self._watchdog.disarm():
                raise Overrun(self.io_timeout)

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


class PgBreakListeners:
    """Opens break listeners (for ``BreakWatches``) and names the break channels.
    ``intact``: the statement that finds the lease still ours and unbroken."""

    def __init__(self, db: PgConnection, schema: PgSchema, intact: sql.Composed) -> None:
        self._db = db
        self._schema = schema
        self._intact = intact

    def channel(self, key: str) -> str:
        """The channel a break of ``key``'s leases is notified on (an identifier: at most
        63 bytes, so the key is hashed; the payload, the fencing token, says which lease).
        Known once connected (it names the table's oid)."""
        digest = md5(key.encode()).hexdigest()[:24]
        return f"tasklock_broken_{self._schema.oid}_{digest}"

    def open(self, lease: Lease) -> tuple[BreakListener, bool]:
        """A new listener for the lease, and whether the lease was found broken on making it."""
        if not self._schema.oid:
            self._db.run(lambda conn: None)  # learn the table's oid
        conn = self._db.connect()
        listener = BreakListener(conn, str(lease.fencing_token), self._db.io_timeout)
        try:
            listen = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel(lease.key)))
            params = {
                "key": lease.key,
                "slot": lease.slot,
                "owner": lease.owner_token,
                "fence": lease.fencing_token,
            }

            def listen_then_look() -> tuple | None:
                conn.execute(listen)  # committed (autocommit) before the look: nothing missed
                return conn.execute(self._intact, params).fetchone()

            intact = listener.guarded(listen_then_look)
        except BaseException:
            listener.close()
            raise
        return listener, intact is None
