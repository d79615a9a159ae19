"""tasklock: run a command at most once at a time across processes and machines.

The Python API's names (``Locks``, ``Lease``, ``LockNotAcquired``, ``LockLost``,
``ManualClock``, ``current_lease``, ...) are imported from ``tasklock_cli.api`` on first
use (PEP 562): the CLI imports this package at every start, and must not pay for them.
"""

__version__ = "0.1.0"

#: The API's public names, each imported from tasklock_cli.api when first asked for.
_API_NAMES = frozenset(
    {
        "Lease",
        "LockContext",
        "LockLost",
        "LockNotAcquired",
        "Locks",
        "ManualClock",
        "Outcome",
        "TasklockError",
        "current_lease",
    }
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.api import Lease as Lease
    from tasklock_cli.api import LockContext as LockContext
    from tasklock_cli.api import LockLost as LockLost
    from tasklock_cli.api import LockNotAcquired as LockNotAcquired
    from tasklock_cli.api import Locks as Locks
    from tasklock_cli.api import ManualClock as ManualClock
    from tasklock_cli.api import Outcome as Outcome
    from tasklock_cli.api import TasklockError as TasklockError
    from tasklock_cli.api import current_lease as current_lease


def __getattr__(name: str) -> object:
    if name not in _API_NAMES:
        raise AttributeError(f"module 'tasklock_cli' has no attribute {name!r}")
    from tasklock_cli import api

    value = getattr(api, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API_NAMES})


__all__ = sorted(_API_NAMES)
