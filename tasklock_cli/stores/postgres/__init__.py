"""PostgreSQL store (psycopg 3): the server's clock decides expiry.

What it keeps where: one table (``table=``, default ``tasklock_leases``), a row per key and
slot, a fencing counter row per key (slot -1) and the failover epoch row; rows are cleared,
never deleted. Every lease statement is one autocommit statement timed by the server's
``clock_timestamp()``. Waiters queue in ``<table>_waiters`` and hear releases by
LISTEN/NOTIFY (``waiting``); holders hear breaks the same way (``breaks``). A change of
primary starts a failover epoch and its quarantine (``epochs``).

The design and its arguments: docs/design/postgres.md.
"""

from __future__ import annotations

from tasklock_cli.stores.failover import DEFAULT_TTL_S
from tasklock_cli.stores.model import WAITER_TTL_S
from tasklock_cli.stores.registry import Driver
from tasklock_cli.stores.traits import Capabilities
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "postgresql"
SCHEMES = ("postgresql", "postgres")
URL_FORM = "postgresql://..."
DRIVER = Driver("psycopg", "psycopg[binary]>=3.1")
#: ``PostgresStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "PostgresStore")
__all__ = ["PostgresStore"]
#: What the store can do, its class's traits (see ``traits.Capabilities``).
CAPABILITIES = Capabilities(
    signals_release=True,  # LISTEN/NOTIFY
    concurrent_release=False,
    waits_keep_places=False,
    byte_keys=False,  # text is UTF-8
    min_ttl=0.0,
    expiry_lag=0.0,
    waiter_ttl=WAITER_TTL_S,
    failover_window=DEFAULT_TTL_S,  # a promoted asynchronous standby may lack the last leases
)
