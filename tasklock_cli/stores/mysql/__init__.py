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
