"""SQLite file store: one machine, many processes.

Expiry runs on CLOCK_BOOTTIME tagged with the kernel's boot id, so a wall-clock jump
changes nothing and a reboot (which ended every holder) frees every lease.

A lease is a row per key and slot (a plain lock is slot 0 of limit 1). Rows are freed,
never deleted, so the highest fencing token among a key's rows is its counter.

A lease's mode (exclusive or shared) is kept in its holder JSON; shared holders each
hold a slot of their own (0, 1, ...) under limit 1.

Waiting runs queue in the ``tasklock_waiters`` table:

- It has a row per waiter, with its mode.
- Rows are served in ``(place, seq)`` order.
- A row is live until it runs out on the boot clock.
- For ``front`` and ``supersede`` places, see queue.
- The acquire checks and keeps the queue in its write transaction.

Wake-ups (see waiting and breaks):

- A release wakes the waiters it may admit on this machine.
  Those are the head of the queue, and the shared run at the head.
- It wakes them through their FIFOs in ``<file>.waiters/``, named in their rows.
- Waiters also look again when the lease runs out.
- A break or forced release tells the lease's holder through its FIFO in
  ``<file>.holders/``.
- A broken lease keeps its row.
  Its owner token is prefixed with ``broken:`` (see base).

The row of key ``''`` keeps in its holder the longest TTL an acquire has asked for
(``max_ttl``).
No lock key is empty, and that row is never a lease: it has no owner.

A lease whose expiry cannot be read is never judged expired.
Its expiry cannot be read when it has no boot, or an expiry that is NULL or not a number.
``sweep`` and ``release --force`` give it now + ``model.unreadable_expiry_bound(max_ttl)``.
Past that time no holder's lease can be valid.
Its last renewal was before now, and lasted at most max_ttl.
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
    concurrent_release=False,
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
