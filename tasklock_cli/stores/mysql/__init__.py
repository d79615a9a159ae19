"""MySQL/MariaDB store (PyMySQL): the server's clock decides expiry.

The URL is ``mysql://USER[:PASSWORD]@HOST[:PORT]/DB`` (or ``mariadb://``).
It takes ``?table=NAME`` (default ``tasklock_leases``), ``unix_socket=``, ``ssl_ca=``,
``ssl_cert=`` and ``ssl_key=``.

The schema:

- Three InnoDB tables: ``<table>``, ``<table>_runs``, ``<table>_waiters``.
- Six stored procedures: ``<table>_acquire``, ``_release``, ``_break``, ``_force``,
  ``_wake``, ``_wake_queue``.
- They are created on first use under a named lock.
  Or a DBA creates them from ``tasklock init --print-sql``.

The lease table:

- It has a row per key and slot (``PRIMARY KEY (key, slot)``).
  The key is kept exactly, as VARBINARY.
- Per key, it has a counter row (slot -1) holding the last fencing token issued.
  Acquirers of a key queue on its row lock.
  So the acquire procedure reads the key's latest state and needs no retries.
- Rows are never deleted.
  Release, sweep and force release clear the owner, so the counter survives them.
- A broken lease keeps its row.
  Its owner token is prefixed with ``broken:`` (see base), and ``broken_by`` is beside it.

MySQL has no ``UPDATE ... RETURNING`` and no writable CTEs.

- Acquire, release, break and force release are stored procedures.
  Each is one ``CALL`` (one round trip).
  Each runs in a transaction of its own, which a failing statement rolls back.
- Renew is one multi-statement query.
  It computes the expiry, runs the UPDATE, and returns the expiry when the UPDATE changed
  the row.
- Every time written is ``SYSDATE(6)`` on the server, in UTC (the session's time zone).
  It is read after the row locks are held.
- Sessions run READ COMMITTED.
- Deadlocks (1213) and lock wait timeouts (1205) are retried and never surface.

Waiting runs queue in ``<table>_waiters`` (see ``queue``).
There is no LISTEN/NOTIFY (see ``waiting``):

- A waiter sleeps on the server, on a connection of its own.
  It holds a named lock for its place.
- The release that may admit it ends that sleep with ``KILL QUERY``.
- Without a place, or where KILL is refused, it looks again every ``WAITER_SLEEP_S``.
  Those looks are reads only.
- It wakes by itself when the first lease runs out.
- A holder hears a break the same way (see ``breaks``).
  Its break watch sleeps holding its lease's named lock.
  The break's ``KILL QUERY`` ends that sleep.

A new connection costs PyMySQL's handshake and one round trip of set-up.
The session settings and the look at the schema go in one multi-statement query.
Every call is bounded by the I/O timeout (``set_io_timeout``):

- socket timeouts on the client;
- ``max_statement_time`` (MariaDB) or ``max_execution_time`` (MySQL) on the server;
- ``innodb_lock_wait_timeout`` on the server.

Failover epochs (``epochs``) work as on PostgreSQL, whose package docstring has the
argument.
A promoted asynchronous replica may lack the last leases, renewals and tokens its primary
granted.

- The acquire procedure reads the server's identity: ``server_id``, host name and port.
  On MySQL it reads ``server_uuid`` too.
- It compares that identity with the one the table's epoch row records.
- When they differ, it starts a new epoch.
- No slot is then taken in the table until ``quarantine_until``.
  That is max(the longest TTL recorded, 30 s) + 2 s from the first acquire on the new
  primary.
- Every token is at least ``epoch << 30``.
- A replica's ``server_id`` differs from its primary's: replication stops when they are
  equal.
  So a promotion is always a change.
- A restart is not a change.
  InnoDB keeps what it committed, with ``innodb_flush_log_at_trx_commit = 1``.
- Only rare acquires lock the epoch row: a change, a longer TTL than any before, a missing
  row.
  The others read it.
- A read-only server grants nothing.
  Such a server is a replica, which a user with READ ONLY ADMIN may write to.

The parts:

- ``store``: the class and its statements;
- ``queue``: the acquire procedure and the queues;
- ``epochs``: the failover epoch row;
- ``schema``: tables, procedures, their creation;
- ``connection``;
- ``breaks``: break watches;
- ``doctor``.
"""

from __future__ import annotations

from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.model import WAITER_TTL_S
from tasklock_cli.stores.registry import Driver
from tasklock_cli.stores.traits import Capabilities
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "mysql"
SCHEMES = ("mysql", "mariadb")
URL_FORM = "mysql://USER[:PASSWORD]@HOST[:PORT]/DB"
DRIVER = Driver("pymysql", "PyMySQL>=1.1")
#: ``MySQLStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "MySQLStore")
__all__ = ["MySQLStore"]
#: What the store can do, its class's traits (see ``traits.Capabilities``).
CAPABILITIES = Capabilities(
    signals_release=True,  # KILL QUERY of the sleeping waiters
    concurrent_release=True,
    waits_keep_places=False,
    byte_keys=True,  # VARBINARY keys
    min_ttl=0.0,
    expiry_lag=0.0,
    waiter_ttl=WAITER_TTL_S,
    failover_window=DEFAULT_TTL_S,  # a promoted asynchronous replica may lack the last leases
)
