"""MySQL/MariaDB store (PyMySQL): the server's clock decides expiry.

``mysql://USER[:PASSWORD]@HOST[:PORT]/DB`` (or ``mariadb://``), with ``?table=NAME``
(default ``tasklock_leases``), ``unix_socket=``, ``ssl_ca=``, ``ssl_cert=``, ``ssl_key=``.
Three InnoDB tables (``<table>``, ``<table>_runs``, ``<table>_waiters``) and six stored
procedures (``<table>_acquire``, ``_release``, ``_break``, ``_force``, ``_wake``,
``_wake_queue``), created on
first use under a named lock, or by a DBA from ``tasklock init --print-sql``.

The lease table has a row per key and slot (``PRIMARY KEY (key, slot)``, the key kept
exactly as VARBINARY), and per key a counter row (slot -1) holding the last fencing token
issued: acquirers of a key queue on its row lock, so the acquire procedure reads the key's
latest state and needs no retries. Rows are never deleted: release, sweep and force
release clear the owner, so the counter survives them. A broken lease keeps its row, its
owner token prefixed with ``broken:`` (see base), ``broken_by`` beside it.

MySQL has no ``UPDATE ... RETURNING`` and no writable CTEs: acquire, release, break and
force release are stored procedures, one ``CALL`` (one round trip) each, in a transaction
of their own that a failing statement rolls back; renew is one multi-statement query
(compute the expiry, UPDATE, return it when the UPDATE changed the row). Every time
written is ``SYSDATE(6)`` on the server, in UTC (the session's time zone), read after the
row locks are held; sessions run READ COMMITTED; deadlocks (1213) and lock wait timeouts
(1205) are retried and never surface.

Waiting runs queue in ``<table>_waiters`` (see ``queue``). There is no LISTEN/NOTIFY:
a waiter sleeps on the server, on a connection of its own, holding a named lock for its
place, and the release that may admit it ends that sleep with ``KILL QUERY`` (see
``waiting``); without a place, or where KILL is refused, it looks again every
``WAITER_SLEEP_S`` (reads only), and wakes by itself when the first lease runs out. A
holder hears a break the same way: its break watch sleeps holding its lease's named lock,
which the break's ``KILL QUERY`` ends (see ``breaks``).

A new connection costs PyMySQL's handshake and one round trip of set-up: the session
settings and the look at the schema, as one multi-statement query. Every call is bounded
by the I/O timeout (``set_io_timeout``): socket timeouts on the client, and
``max_statement_time`` (MariaDB) or ``max_execution_time`` (MySQL) and
``innodb_lock_wait_timeout`` on the server.

Failover epochs (``epochs``), as on PostgreSQL (whose package docstring has the argument):
a promoted asynchronous replica may lack the last leases, renewals and tokens its primary
granted. The acquire procedure reads the server's identity (``server_id``, host name and
port; MySQL's ``server_uuid`` too) and compares it with the one the table's epoch row
records; when they differ it starts a new epoch: no slot is taken in the table until
``quarantine_until`` (max(the longest TTL recorded, 30 s) + 2 s from the first acquire on
the new primary), and every token is at least ``epoch << 30``. A replica's ``server_id``
differs from its primary's (replication stops when they are equal), so a promotion is
always a change; a restart is not (InnoDB keeps what it committed, with
``innodb_flush_log_at_trx_commit = 1``). Only rare acquires lock the epoch row (a change,
a longer TTL than any before, a missing row); the others read it. A read-only server (a
replica, which a user with READ ONLY ADMIN may write to) grants nothing.

The parts: ``store`` (the class and its statements), ``queue`` (the acquire procedure and
the queues), ``epochs`` (the failover epoch row), ``schema`` (tables, procedures, their
creation), ``connection``, ``breaks`` (break watches) and ``doctor``.
"""

from __future__ import annotations

from tasklock_cli.stores.registry import Driver
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "mysql"
SCHEMES = ("mysql", "mariadb")
URL_FORM = "mysql://USER[:PASSWORD]@HOST[:PORT]/DB"
DRIVER = Driver("pymysql", "PyMySQL>=1.1")
#: ``MySQLStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "MySQLStore")
__all__ = ["MySQLStore"]
