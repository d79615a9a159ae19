"""The PostgreSQL store's waiting machinery: a waiter's LISTEN on the table's release
channel, and its place in the key's queue (a row of the waiters' table, which the
acquire statement joins, keeps and leaves: see ``queue``).

A release notifies the head of the key's queue by name (``head_payload`` of its place),
and with a shared head the shared places right behind it, so only the waiters it may
admit look at the key: no herd. A release of a key nobody queues for, a forced release
and a sweep notify the key itself (every waiter of it looks). A waiter whose place runs
out (it crashed) is passed over by the acquire statement; the one behind it finds its
turn at its next look."""

from __future__ import annotations

import time

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from tasklock_cli.stores.postgres.connection import PgConnection
from tasklock_cli.stores.postgres.schema import PgSchema
from tasklock_cli.util.fds import wait_readable

#: Longest slice a waiter holds the store's lock while waiting for a notification.
WAIT_SLICE_S = 0.1
#: Notification payloads are limited to 8000 bytes; longer keys are sent as md5(key).
MAX_PAYLOAD_KEY_BYTES = 7000
#: What starts a payload naming a waiter's place: a control character, which no key has.
HEAD_PREFIX = "\x1fwaiter:"


def payload_for(key: str) -> str:
    encoded = key.encode("utf-8")
    if len(encoded) <= MAX_PAYLOAD_KEY_BYTES:
        return key
    import hashlib  # (here: OpenSSL's libcrypto, ~11 M instructions, for a long key only)

    return hashlib.md5(encoded).hexdigest()


def head_payload(seq: int) -> str:
    return f"{HEAD_PREFIX}{seq}"


class PgListening:
    """Whether this client's session LISTENs (it ends with the session), and our places
    in queues: key -> the place's ``seq``."""

    def __init__(self, db: PgConnection, schema: PgSchema) -> None:
        self._db = db
        self._schema = schema
        self.listening = False
        self.places: dict[str, int] = {}
        db.on_new_session.append(self.forget)

    def forget(self) -> None:
        self.listening = False

    def prepare(self) -> None:
        """LISTEN (before the look at the key: a release after it is not missed)."""
        self._db.run(self._listen)

    def await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        wanted = {payload_for(key)}
        if key in self.places:
            wanted.add(head_payload(self.places[key]))
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            slice_s = min(left, WAIT_SLICE_S, self._db.io_timeout / 2)
            if self._wait_slice(wanted, slice_s, wake_fd):
                return

    def acquire(self, conn: psycopg.Connection, statement: sql.Composed, params: dict) -> list:
        """An acquire in the same round trip as an UNLISTEN when we listen (notifications
        would pile up on a holder's connection; a refused acquire listens again at its next
        wait). One simple query (parameters bound client-side), one implicit transaction."""
        if not self.listening:
            return conn.execute(statement, params).fetchall()
        cursor = psycopg.ClientCursor(conn)
        cursor.execute(sql.SQL("UNLISTEN *; ") + statement, params)
        cursor.nextset()
        rows = cursor.fetchall()
        self.listening = False
        for _ in conn.notifies(timeout=0):  # what arrived before the UNLISTEN
            pass
        return rows

    def stop(self, key: str, leave: sql.Composed) -> None:
        """UNLISTEN and leave our place in ``key``'s queue (``leave`` wakes the waiter
        after us), in one round trip."""
        place = self.places.pop(key, None)

        def run(conn: psycopg.Connection) -> None:
            statements: list[sql.Composable] = []
            if self.listening:
                statements.append(sql.SQL("UNLISTEN *"))
            if place is not None:
                statements.append(leave)
            if not statements:
                return
            cursor = psycopg.ClientCursor(conn)
            params = {"key": key, "seq": place, "channel": self._schema.channel}
            cursor.execute(sql.SQL("; ").join(statements), params)
            self.listening = False
            for _ in conn.notifies(timeout=0):
                pass

        with self._db.lock:
            conn = self._db.current
            if conn is not None and conn.info.transaction_status != TransactionStatus.IDLE:
                self._db.drop()  # cut off mid-call (a signal): the place runs out by itself
                return
        if self.listening or place is not None:
            self._db.run(run)

    def _listen(self, conn: psycopg.Connection) -> None:
        if not self.listening:
            self.listening = True  # before: a call cut short must still UNLISTEN
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._schema.channel)))
        # Whatever arrived before this point is answered by the look that follows.
        for _ in conn.notifies(timeout=0):
            pass

    def _wait_slice(self, wanted: set[str], seconds: float, wake_fd: int | None = None) -> bool:
        """Wait up to ``seconds`` for a notification in ``wanted``, or for ``wake_fd`` to
        be readable; True when either came."""

        def heard(conn: psycopg.Connection, timeout: float) -> bool:
            notes = conn.notifies(timeout=timeout)
            try:
                return any(note.payload in wanted for note in notes)
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
