"""SQLite file store: one machine, many processes.

What it keeps where: a row per key and slot (freed, never deleted: the highest fencing
token among a key's rows is its counter; slot -1, never a lease, reserves the key's block of
tokens for this boot, so that most acquires need no sync) and the waiters' places in
``tasklock_waiters``.
Expiry runs on CLOCK_BOOTTIME tagged with the boot id: a wall-clock jump changes nothing and
a reboot frees every lease. A release wakes the waiters it may admit through their FIFOs in
``<file>.waiters/`` (``waiting``); a break tells its holder through a FIFO in
``<file>.holders/`` (``breaks``).

The design and its arguments: docs/design/sqlite.md.
"""

from __future__ import annotations

from tasklock_cli.stores.model import WAITER_TTL_S
from tasklock_cli.stores.traits import Capabilities
from tasklock_cli.stores.urls import url_syntax_problem
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "sqlite"
SCHEMES = ("sqlite",)
URL_FORM = "sqlite:///PATH"
DRIVER = None
#: ``SQLiteStore`` is imported on first use: a companion module never brings the driver.
__getattr__ = import_on_first_use(__name__, "store", "SQLiteStore")
__all__ = ["SQLiteStore"]
#: What the store can do, its class's traits (see ``traits.Capabilities``).
CAPABILITIES = Capabilities(
    signals_release=True,  # among processes on this machine (see waiting and breaks)
    # Its calls take the connection's lock, and a release closes nothing a wait for a break
    # uses (``breaks``): the heartbeat is joined after the release, off the hand-off.
    concurrent_release=True,
    waits_keep_places=False,
    byte_keys=True,  # SQLite's text holds any bytes
    min_ttl=0.0,
    expiry_lag=0.0,
    waiter_ttl=WAITER_TTL_S,
    failover_window=None,  # one file: no failover
)


def url_problem(url: str) -> str | None:
    """A plain ``sqlite:///PATH`` is read without ``urllib.parse`` (start-up cost)."""
    return None if url.startswith("sqlite:///") else url_syntax_problem(url)
