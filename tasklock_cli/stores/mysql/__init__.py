"""MySQL/MariaDB store (PyMySQL): the server's clock (``SYSDATE(6)``) decides expiry.

What it keeps where: ``<table>`` (a row per key and slot and a fencing counter row per key;
rows cleared, never deleted), ``<table>_runs`` and ``<table>_waiters``; acquire, release,
break and force release are stored procedures, one ``CALL`` each. A waiter sleeps on the
server holding a named lock for its place, and the release that may admit it ends the
sleep with ``KILL QUERY`` (``waiting``); a holder hears a break the same way (``breaks``).
A change of server starts a failover epoch and its quarantine (``epochs``).

The parts: ``store`` (the class and its statements), ``queue`` (the acquire procedure and
the queues), ``epochs``, ``schema`` (tables, procedures, their creation), ``connection``,
``driver`` (PyMySQL imported without ``ssl``), ``waiting``, ``breaks``, ``doctor``.
The design and its arguments: docs/design/mysql.md.
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
