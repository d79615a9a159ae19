"""In-process store (``memory://[NAME]``): leases in this process's memory, for tests.

Programs that use the Python API test their locking code against it: no server, no file,
and time that moves only when the test says (``Locks(..., clock=ManualClock())``). It is
the reference store that only polls: it overrides no waiting or break-watching method of
the base class, so the contract suite runs those defaults through it.

Every store opened on the same NAME in one process shares one space (``connection``): two
``Locks`` objects in a test stand for two instances of a service. The CLI refuses it (78):
a lock that lives in one process excludes nobody else. ``Locks`` takes it only with
``allow_memory=True``, so that a test store cannot end up in production by a typo.
"""

from __future__ import annotations

from tasklock_cli.stores.model import WAITER_TTL_S
from tasklock_cli.stores.traits import Capabilities
from tasklock_cli.util.lazy import import_on_first_use

TITLE = "memory"
SCHEMES = ("memory",)
URL_FORM = "memory://[NAME]"
DRIVER = None
#: In-process: opened only by the Python API, and there only when allowed (see registry).
IN_PROCESS = True
__getattr__ = import_on_first_use(__name__, "store", "MemoryStore")
__all__ = ["MemoryStore"]
#: What the store can do, its class's traits (see ``traits.Capabilities``).
CAPABILITIES = Capabilities(
    signals_release=False,  # it only polls: the base class's defaults run through the contract
    concurrent_release=True,  # every call holds the space's lock; nothing to close
    waits_keep_places=False,
    byte_keys=False,
    min_ttl=0.0,
    expiry_lag=0.0,
    waiter_ttl=WAITER_TTL_S,
    failover_window=None,
)


def url_problem(url: str) -> str | None:
    """``memory://`` or ``memory://NAME``; parameters are refused by ``from_url``."""
    return None if url.startswith("memory://") else "expected memory:// or memory://NAME"
