"""The Python API: locks in-process on the CLI's stores, keys, tokens and ledger.

    from tasklock_cli import Locks
    locks = Locks()                       # the store `tasklock run` would use
    with locks.lock("reports:nightly", ttl="30s") as lease:
        export(fencing_token=lease.fencing_token)

A CLI run and an API lock on the same key and store exclude each other, and their fencing
tokens are one sequence. The leases are kept by the CLI's own engine (``run.keeper``,
``run.heartbeat``, ``run.waiter``); process supervision stays the CLI's: a block is never
interrupted, ``lease.lost`` and the fencing token are its protection (``async with`` blocks
are cancelled).
"""

from __future__ import annotations

from tasklock_cli.api.context import LockContext
from tasklock_cli.api.lease import Lease
from tasklock_cli.api.lease import current_lease
from tasklock_cli.api.locks import Locks
from tasklock_cli.api.locks import Outcome
from tasklock_cli.errors import LockLost
from tasklock_cli.errors import LockNotAcquired
from tasklock_cli.errors import TasklockError
from tasklock_cli.util.clock import ManualClock

__all__ = [
    "Lease",
    "LockContext",
    "LockLost",
    "LockNotAcquired",
    "Locks",
    "ManualClock",
    "Outcome",
    "TasklockError",
    "current_lease",
]
