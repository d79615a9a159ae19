"""The PostgreSQL store's waiting machinery: a waiter's turn among a key's waiters (a
session advisory lock) and its LISTEN on the table's release channel.

Only a key's first waiter listens; the others queue on the advisory lock behind it, so a
release wakes one waiter, not all of them at once. The first waiter keeps its turn until
it gets the lease (its acquire ends the turn in the same statement), stops waiting, or
its session ends; then the next in line listens and looks at the key."""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable

import psycopg
import psycopg.errors as pgerr
from psycopg import sql
from psycopg.pq import TransactionStatus

from tasklock_cli.stores.base import fd_readable
from tasklock_cli.stores.base import wait_readable
from tasklock_cli.stores.postgres.connection import PgConnection
from tasklock_cli.stores.postgres.schema import PgSchema

#: Longest slice a waiter holds the store's lock while waiting for a notification.
WAIT_SLICE_S = 0.1
#: Longest slice a waiter queues for its turn to listen.
TURN_SLICE_S = 0.5
#: The same for a caller that passes a ``wake_fd``, looked at between slices.
TURN_SLICE_WAKE_FD_S = 0.05
#: Notification payloads are limited to 8000 bytes; longer keys are sent as md5(key).
MAX_PAYLOAD_KEY_BYTES = 7000


def payload_for(key: str) -> str:
    encoded = key.encode("utf-8")
    if len(encoded) <= MAX_PAYLOAD_KEY_BYTES:
        return key
    return hashlib.md5(encoded).hexdigest()


class PgTurns:
    """This client's place among waiters: the key whose turn it holds (``turn_of``) and
    whether its session LISTENs. Both end with the session (``forget``)."""

    def __init__(self, db: PgConnection, schema: PgSchema) -> None:
        self._db = db
        self._schema = schema
        self.listening = False
        self.turn_of: str | None = None  # the key whose first waiter we are
        db.on_new_session.append(self.forget)

    def forget(self) -> None:
        self.listening = False
        self.turn_of = None

    @property
    def waiting(self) -> bool:
        return self.listening or self.turn_of is not None

    def prepare(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        """Take our turn at ``key`` (False when it did not come before ``deadline`` or
        ``wake_fd`` became readable), then LISTEN."""
        if self.turn_of != key and not self._wait_for_turn(key, deadline, wake_fd):
            return False  # still queued behind another waiter: the caller looks again
        self._db.run(self._listen)
        return True

    def await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        wanted = payload_for(key)
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            slice_s = min(left, WAIT_SLICE_S, self._db.io_timeout / 2)
            if self._wait_slice(wanted, slice_s, wake_fd):
                return

    def acquire(
        self,
        conn: psycopg.Connection,
        statement: Callable[[sql.Composable], sql.Composed],
        params: dict,
    ) -> tuple | None:
        """A waiter's acquire, in the same round trip as what a holder no longer needs:
        UNLISTEN (notifications would pile up on the connection) and, when the lease is
        granted, the end of its turn, so the next waiter in line listens at once.
        ``statement(turn_end)``: the acquire with a column that ends the turn when it is
        taken (the row's first column is ``'taken'`` then).

        One simple query (parameters bound client-side), one implicit transaction. A
        refused acquire has still unlistened: the next wait listens again first."""
        turn_end: sql.Composable = sql.SQL("")
        if self.turn_of is not None:
            unlock = self._turn_lock("pg_advisory_unlock", self.turn_of, call_only=True)
            turn_end = sql.SQL(", CASE WHEN r.outcome = 'taken' THEN {} END").format(unlock)
        cursor = psycopg.ClientCursor(conn)
        cursor.execute(sql.SQL("UNLISTEN *; ") + statement(turn_end), params)
        cursor.nextset()
        row = cursor.fetchone()
        self.listening = False
        if row is not None and row[0] == "taken":
            self.turn_of = None
        for _ in conn.notifies(timeout=0):  # what arrived before the UNLISTEN
            pass
        return row

    def stop(self, key: str) -> None:
        """UNLISTEN and hand the turn on, in one round trip. The next waiter in line then
        listens and looks at the key, so a notification we did not use is not lost."""

        def run(conn: psycopg.Connection) -> None:
            ours = self.turn_of == key  # (a new connection holds nothing)
            if not (self.listening or ours):
                return
            statement = sql.SQL("UNLISTEN *")
            if ours:
                statement += sql.SQL("; ") + self._turn_lock("pg_advisory_unlock", key)
            conn.execute(statement)
            self.listening = False
            if ours:
                self.turn_of = None
            for _ in conn.notifies(timeout=0):
                pass

        with self._db.lock:
            conn = self._db.current
            if conn is not None and conn.info.transaction_status != TransactionStatus.IDLE:
                self._db.drop()  # cut off mid-call (a signal): ending the session gives up all
                return
        if self.listening or self.turn_of == key:
            self._db.run(run)

    def _wait_for_turn(self, key: str, deadline: float, wake_fd: int | None = None) -> bool:
        """Queue (in slices) for the key's waiters' advisory lock; True once it is ours.
        With ``wake_fd``, slices are short and it is looked at between them (False)."""
        longest = TURN_SLICE_S if wake_fd is None else TURN_SLICE_WAKE_FD_S
        while True:
            left = min(deadline - time.monotonic(), longest, self._db.io_timeout / 2)
            if left < 0.001 or fd_readable(wake_fd):
                return False
            if self._db.run(functools.partial(self._take_turn, key, left)):
                return True

    def _take_turn(self, key: str, seconds: float, conn: psycopg.Connection) -> bool:
        if self.turn_of is not None:  # our turn at another key: give it up first
            conn.execute(self._turn_lock("pg_advisory_unlock", self.turn_of))
            self.turn_of = None
        # One simple query, one implicit transaction: the SET LOCAL ends with it.
        timeout = sql.SQL("SET LOCAL lock_timeout = {}; ").format(
            sql.Literal(max(1, int(seconds * 1000)))
        )
        # Marked before it is asked for: a call cut short after the server granted it must
        # still be given up (unlocking a lock we do not hold only warns).
        self.turn_of = key
        try:
            conn.execute(timeout + self._turn_lock("pg_advisory_lock", key))
        except pgerr.LockNotAvailable:
            self.turn_of = None
            return False
        except Exception:
            self.turn_of = None  # failed: not ours
            raise
        return True

    def _turn_lock(self, function: str, key: str, call_only: bool = False) -> sql.Composed:
        """``SELECT function(space, hashtext(key))`` with literals, for simple queries."""
        call = sql.SQL("{}({}, hashtext({}))").format(
            sql.Identifier(function), sql.Literal(self._schema.turn_space), sql.Literal(key)
        )
        return call if call_only else sql.SQL("SELECT ") + call

    def _listen(self, conn: psycopg.Connection) -> None:
        if not self.listening:
            self.listening = True  # before, like the turn: see _take_turn
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._schema.channel)))
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
            if not self.listening:
                return True  # the connection was replaced: let the caller look again
            if wake_fd is None:
                return heard(conn, seconds)
            if heard(conn, 0):  # what was read already sits in psycopg's backlog
                return True
            ready = wait_readable([conn.fileno(), wake_fd], seconds)
            if not ready:
                return False
            return conn.fileno() not in ready or heard(conn, 0)

        return self._db.run(wait)
