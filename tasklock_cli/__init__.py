"""tasklock: run a command at most once at a time across processes and machines.

The Python API's names (``Locks``, ``Lease``, ``LockNotAcquired``, ``LockLost``,
``ManualClock``, ``current_lease``, ...) are imported from ``tasklock_cli.api`` on first
use (PEP 562): the CLI imports this package at every start, and must not pay for them.
"""

__version__ = "0.1.0"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

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
    """An API name (``tasklock_cli.api.__all__``, the one list of them), imported now;
    ``__all__`` too, for ``from tasklock_cli import *``."""
    if (name.startswith("_") and name != "__all__") or name == "api":
        raise AttributeError(f"module 'tasklock_cli' has no attribute {name!r}")
    api = _api()
    if name == "__all__":
        return list(api.__all__)
    if name not in api.__all__:
        raise AttributeError(f"module 'tasklock_cli' has no attribute {name!r}")
    value = getattr(api, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_api().__all__})


def _api() -> "ModuleType":
    # (import_module, not `from tasklock_cli import api`: that asks this module's
    # __getattr__ for "api" first)
    from importlib import import_module

    return import_module("tasklock_cli.api")
