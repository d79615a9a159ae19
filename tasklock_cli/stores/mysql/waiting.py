"""How MySQL/MariaDB waiters and holders are woken without LISTEN/NOTIFY.

- They sleep on the server, on a connection of their own.
- Meanwhile they hold a named lock that names what they wait for.
- Whoever changes that thing ends the sleep with ``KILL QUERY``.
- It finds the sleeper by ``IS_USED_LOCK``, in the same procedure call as the change.

A waiter with a place in a key's queue holds its place's lock (``place_lock_name``).
A release wakes the places it may admit, not the crowd.
Those are the head of the queue, and, when that is shared, the shared places after it up
to the first exclusive one.
The ``<table>_wake_queue`` procedure finds them.

Each sleep statement first compares the key with what the waiter's look saw.
So a release between the look and the sleep is not missed.
Each sleeps at most ``WAITER_SLEEP_S``.
Where KILL is refused, the waiter looks again that often (reads only).
KILL is refused for another database user without CONNECTION ADMIN.
A waiter without a place looks again every ``PLACELESS_LOOK_S``.
"""

from __future__ import annotations

import _thread
import contextlib
import time
from collections.abc import Callable

from tasklock_cli.stores.mysql.connection import MySQLConnection
from tasklock_cli.stores.mysql.driver import COMMAND
from tasklock_cli.stores.mysql.driver import pymysql
from tasklock_cli.util.fds import wait_readable

#: Longest sleep of a waiter's statement (its wake-up, where KILL is refused).
WAITER_SLEEP_S = 0.25
#: How often a waiter without a place looks again (nothing can wake it: only the API
#: waits so; ``run --wait`` always queues).
PLACELESS_LOOK_S = 0.1
_INTERRUPTED = 1317  # KILL QUERY ended the statement (MariaDB; MySQL's SLEEP returns 1)
# 2: the key changed since the look; 1: the sleep was cut short; 0: slept it out.
_LOOK = (
    "SELECT IF((SELECT COUNT(*) FROM `{table}` WHERE `key` = {key} AND slot >= 0"
    " AND owner_token IS NOT NULL AND expires_at > SYSDATE(6)) < {live}"
    " OR COALESCE((SELECT fencing_token FROM `{table}` WHERE `key` = {key} AND slot = -1), 0)"
    " <> {counter}, 2, IF(SLEEP({sleep:.3f}) = 1, 1, 0))"
)


def place_lock_name(database: str, table: str, seq: int) -> str:
    """The named lock a waiter holds for its place ``seq`` (at most 64 characters); the
    ``<table>_wake_queue`` procedure computes the same name. (hashlib is imported here:
    see ``queue.break_lock_name``.)"""
    import hashlib

    digest = hashlib.sha1(f"{database}.{table}".encode()).hexdigest()[:32]
    return f"tl:{digest}:w{seq}"


class ServerSleep:
    """A connection of its own, with at most one sleeping statement in flight. A statement
    not answered within its sleep and the I/O timeout means a dead connection: OSError."""

    def __init__(self, conn: pymysql.connections.Connection, io_timeout: float) -> None:
        self.lock = _thread.allocate_lock()  # one waiter at a time
        self.conn = conn
        self._io_timeout = io_timeout
        self._due: float | None = None  # when the statement in flight must have answered

    def wait(
        self, statement: str, sleep_s: float, deadline: float, wake_fd: int | None
    ) -> int | None:
        """Send ``statement`` and wait for its answer until ``deadline``.

        The statement sleeps at most ``sleep_s``.
        It is not sent when one is still in flight from an earlier wait.
        Returns the answer, 1 when KILLed.
        Returns None at the deadline, or when ``wake_fd`` is readable.
        An unanswered statement is read at the next wait."""
        sock = self.conn._sock
        if sock is None:  # (closed)
            raise OSError("the connection is closed")
        if self._due is None:
            self.conn._execute_command(COMMAND.COM_QUERY, statement)
            self._due = time.monotonic() + sleep_s + self._io_timeout
        fileno = sock.fileno()
        until = min(deadline, self._due)
        ready = wait_readable([fileno, wake_fd], max(0.0, until - time.monotonic()))
        if fileno not in ready:
            if not ready and time.monotonic() >= self._due:
                raise OSError("the server did not answer a sleeping statement")
            return None
        self._due = None
        try:
            self.conn._read_query_result()
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == _INTERRUPTED:
                return 1
            raise
        except AttributeError:  # PyMySQL's socket gone: ``close`` from another thread
            if self.conn._sock is not None:
                raise
            raise OSError("the connection was closed while its statement slept") from None
        rows = self.conn._result.rows or ((0,),)
        return int(rows[0][0])

    def settle(self) -> None:
        """Read the answer of a statement still in flight, if any (OSError when none
        comes): the connection is then free for another statement."""
        while self._due is not None:
            self.wait("", 0.0, self._due, None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn._force_close()


class WakeLine:
    """A waiter's wake-up line: one connection per store, holding the lock of the place it
    waits in (one at a time), opened at the first wait with a place and kept. Trouble with
    it closes it: that wait looks again by itself, and the next one opens a new line."""

    def __init__(self, db: MySQLConnection, table: str, longest_s: Callable[[], float]) -> None:
        self._db = db
        self._table = table
        self._longest_s = longest_s  # the store's release_look_s (WAITER_SLEEP_S)
        self._sleep: ServerSleep | None = None
        self._held: str | None = None

    def hold(self, seq: int) -> None:
        """Hold the lock of place ``seq`` (and no other)."""
        name = place_lock_name(self._db.database, self._table, seq)
        if self._held == name and self._sleep is not None:
            return
        try:
            if self._sleep is None:
                self._sleep = ServerSleep(self._db.connect(), self._db.io_timeout)
            sleep = self._sleep
            with sleep.lock:
                sleep.settle()  # (a statement of an earlier wait still in flight)
                with sleep.conn.cursor() as cursor:
                    cursor.execute("SELECT RELEASE_ALL_LOCKS(), GET_LOCK(%s, 0)", (name,))
            self._held = name
        except (pymysql.err.MySQLError, OSError):
            self.close()

    def sleep(
        self, key: str, seen: tuple[int, int], until: float, wake_fd: int | None
    ) -> bool | None:
        """Sleep until ``until`` at most, or until woken: True when woken or the key
        changed from ``seen`` (live leases, counter), False when the sleep ran out or
        ``wake_fd`` became readable; None without a line (the caller waits by itself)."""
        sleep = self._sleep
        if sleep is None:
            return None
        sleep_s = max(0.0, min(self._longest_s(), until - time.monotonic()))
        statement = _LOOK.format(
            table=self._table,
            key=sleep.conn.escape(key),
            live=int(seen[0]),
            counter=int(seen[1]),
            sleep=sleep_s,
        )
        try:
            with sleep.lock:
                answer = sleep.wait(statement, sleep_s, until, wake_fd)
        except (pymysql.err.MySQLError, OSError):
            self.close()
            return None
        return bool(answer)

    def close(self) -> None:
        sleep, self._sleep, self._held = self._sleep, None, None
        if sleep is not None:
            sleep.close()
