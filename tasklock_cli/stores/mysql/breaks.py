"""How a MySQL/MariaDB holder hears that its lease was broken, without LISTEN/NOTIFY.

The holder's break watch is a connection of its own (one per lease, kept until its
release) that takes the lease's named lock (``GET_LOCK``; ``queue.break_lock_name``) and
then sleeps on the server, one statement at a time: look at the lease, ``SLEEP``, look
again. A break or forced release finds the watch by its named lock (``IS_USED_LOCK``) and
ends its sleep with ``KILL QUERY``, in the same call (the ``<table>_wake`` procedure), so
the holder hears it at once. KILL needs the same database user (or CONNECTION ADMIN); where
it is refused, the watch's own looks find the break within ``BREAK_LOOK_S``. A break
between two statements is seen by the next one's first look. The watch only reads: what it
hears is a hint, which the holder's renewal confirms."""

from __future__ import annotations

from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.mysql.connection import MySQLConnection
from tasklock_cli.stores.mysql.driver import pymysql
from tasklock_cli.stores.mysql.queue import break_lock_name
from tasklock_cli.stores.mysql.waiting import ServerSleep

#: Longest sleep of one watch statement: where KILL is refused, a break is heard this late.
BREAK_LOOK_S = 1.0
# 0: intact all along; 1: the sleep was cut short; 2: not ours and intact (broken, freed).
_INTACT = (
    "EXISTS (SELECT 1 FROM `{table}` WHERE `key` = {key} AND slot = {slot}"
    " AND owner_token = {owner} AND fencing_token = {fence})"
)
_LOOK = "SELECT IF(NOT {intact}, 2, IF(SLEEP({sleep}) = 1, 1, IF({intact}, 0, 2)))"


class BreakWatch:
    """A lease's watch: its own connection, which sleeps on the server one look at a time."""

    def __init__(
        self, conn: pymysql.connections.Connection, look: str, sleep_s: float, io_timeout: float
    ) -> None:
        self._sleep = ServerSleep(conn, io_timeout)
        self.lock = self._sleep.lock
        self._look = look
        self._sleep_s = sleep_s

    def wait(self, deadline: float, wake_fd: int | None) -> bool:
        """True when a break is heard before ``deadline``; False at the deadline or when
        ``wake_fd`` is readable."""
        while True:
            answer = self._sleep.wait(self._look, self._sleep_s, deadline, wake_fd)
            if answer is None:
                return False
            if answer != 0:
                return True

    def close(self) -> None:
        self._sleep.close()


class MySQLBreakWatches:
    """Opens break watches (for ``BreakWatches``)."""

    def __init__(self, db: MySQLConnection, table: str) -> None:
        self._db = db
        self._table = table

    def open(self, lease: Lease) -> tuple[BreakWatch, bool]:
        """A new watch for the lease, and whether the lease was found broken on making it."""
        conn = self._db.connect()
        try:
            name = break_lock_name(self._db.database, self._table, lease.key, lease.fencing_token)
            intact = _INTACT.format(
                table=self._table,
                key=conn.escape(lease.key),
                slot=int(lease.slot),
                owner=conn.escape(lease.owner_token),
                fence=int(lease.fencing_token),
            )
            sleep = min(BREAK_LOOK_S, self._db.io_timeout / 2)
            with conn.cursor() as cursor:
                # the lock first: a break after the look below finds the watch
                cursor.execute(f"SELECT GET_LOCK(%s, 0), {intact}", (name,))
                _, still = cursor.fetchone()
        except BaseException:
            conn.close()
            raise
        look = _LOOK.format(intact=intact, sleep=f"{sleep:.3f}")
        return BreakWatch(conn, look, sleep, self._db.io_timeout), not still
