"""One exception hierarchy; each class carries the exit code the contract gives it."""

from __future__ import annotations

import signal


class TasklockError(Exception):
    """Base of every error tasklock reports to the user as one line."""

    exit_code = 1


class UsageError(TasklockError):
    """Bad option, bad duration, empty key, no command."""

    exit_code = 2


class ConfigError(TasklockError):
    """Bad config file, unknown URL scheme, schema missing and not creatable."""

    exit_code = 78


class StoreUnavailable(TasklockError):
    """The store could not be reached or did not answer in time."""

    exit_code = 69


class LeaseLost(TasklockError):
    """The store says the lease is no longer ours (expired, broken, taken)."""

    exit_code = 70


class CommandNotFound(TasklockError):
    exit_code = 127


class CommandNotExecutable(TasklockError):
    exit_code = 126


class Interrupted(BaseException):
    """A signal asked us to stop before the command started (say, while waiting).

    Raised from a signal handler, so like KeyboardInterrupt it is no Exception: a store's
    ``except Exception`` / ``except TasklockError`` must not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} before the command started")
