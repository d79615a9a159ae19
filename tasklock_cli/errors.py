"""One exception hierarchy; each class carries the exit code the contract gives it."""

from __future__ import annotations

from tasklock_cli.util.signals import signal_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.model import LeaseInfo


class ExitCode:
    """tasklock's own exit codes (the contract's table); a child's code passes through.

    Plain ints, and LossKind's plain strings, not enums: enum's import is ~17 M of the ~130 M
    instructions a `run` starts with, and these two were all of it a run needed."""

    USAGE = 2
    UNAVAILABLE = 69  # the store is unreachable
    LOST = 70  # the lease was lost while the command ran
    CONFLICT = 75  # the default of --conflict-exit-code
    CONFIG = 78
    NOT_EXECUTABLE = 126
    NOT_FOUND = 127
    SIGNALLED = 128  # + N: killed by signal N
    INTERRUPTED = 130  # 128 + SIGINT


class LossKind:
    """``detected_by`` of a ``lost`` event (``ALL``: every one)."""

    REJECTED = "rejected"  # the store says someone else holds it, or it was broken
    UNREACHABLE = "unreachable"  # could not renew before the deadline
    MAX_LIFETIME = "max-lifetime"
    RESUMED_LATE = "resumed-late"  # this process was paused past its deadline
    REPLACED = "replaced"  # broken by a `run --replace`, which takes the key next
    ALL = (REJECTED, UNREACHABLE, MAX_LIFETIME, RESUMED_LATE, REPLACED)


class TasklockError(Exception):
    """Base of every error tasklock reports to the user as one line."""

    exit_code = 1


class UsageError(TasklockError):
    """Bad option, bad duration, empty key, no command."""

    exit_code = ExitCode.USAGE


class ConfigError(TasklockError):
    """Bad config file, unknown URL scheme, schema missing and not creatable."""

    exit_code = ExitCode.CONFIG


class LimitMismatch(ConfigError):
    """``run --limit N`` on a key whose live holders use another limit."""

    def __init__(self, key: str, held: int, asked: int) -> None:
        self.key, self.held, self.asked = key, held, asked
        super().__init__(
            f"{key!r} is held with --limit {held}, but this run asked for --limit {asked}: "
            "every holder of a key must use the same limit"
        )


class FencingExhausted(ConfigError):
    """The key's fencing counter is at 2**63-1: no greater token can be issued, ever (a
    store state that can never work, so a configuration error, not a conflict)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"the fencing counter of {key!r} has reached 2**63-1 on this store: no greater "
            "token can be issued, so the key cannot be acquired again (use another key)"
        )


class CounterUnreadable(ConfigError):
    """The key's fencing counter is not an integer from 0 to 2**63-1 (someone else wrote
    it): tokens cannot go on from it without perhaps repeating one, so none is issued."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"the fencing counter of {key!r} on this store is not an integer from 0 to "
            "2**63-1 (someone else wrote it): no token is issued from it, as the next one "
            "could repeat an earlier one; set it above every token issued for the key "
            "(nothing was changed)"
        )


class OutputFailed(ConfigError):
    """Standard output cannot be written: closed, a full disk (``> /dev/full``), an I/O
    error. What the command would print is lost, so it does not report success; 78, as
    where the output goes is the caller's setting. (A reader that went away, a closed
    pipe, is not this: the output was not wanted any more.)"""

    def __init__(self, reason: str) -> None:
        super().__init__(f"cannot write the output to standard output: {reason}")


class ForeignKey(ConfigError):
    """A name in the store's namespace holds what tasklock does not keep there (another
    application's key of another type): ``found`` says what. Fatal to an operation on that
    key; a listing shows the record as malformed and goes on."""

    def __init__(self, message: str, found: str) -> None:
        self.found = found
        super().__init__(message)


class NotGranted(TasklockError):
    """The lock was not granted: someone holds it (``run.conflict.Conflict``), a newer run
    superseded this one, or its queue is full. The run ends with the conflict exit code."""

    exit_code = ExitCode.CONFLICT


class Superseded(NotGranted):
    """A newer ``run --supersede`` of the key started waiting: this waiting run gives up."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"a newer --supersede run of {key!r} is waiting; giving up our place")


class QueueFull(NotGranted):
    """``run --max-waiting N``: N runs already wait for the key, so this one does not join
    them (a conflict whose reason is ``queue-full``)."""

    reason = "queue-full"

    def __init__(self, key: str, max_waiting: int) -> None:
        self.key = key
        self.max_waiting = max_waiting
        if max_waiting == 0:
            message = f"{key!r} is held, and --max-waiting 0 never waits"
        else:
            runs = "1 run waits" if max_waiting == 1 else f"{max_waiting} runs wait"
            message = f"{key!r} is held and {runs} for it already (--max-waiting {max_waiting})"
        super().__init__(message)


class StoreUnavailable(TasklockError):
    """The store could not be reached or did not answer in time."""

    exit_code = ExitCode.UNAVAILABLE


class LeaseLost(TasklockError):
    """The store says the lease is no longer ours (expired, broken, taken)."""

    exit_code = ExitCode.LOST


class LockNotAcquired(TasklockError):
    """The Python API's ``Locks.lock``: the key is held by someone else and the wait (if
    any) ran out. ``holder`` is the holder then (a ``LeaseInfo``), when known."""

    exit_code = ExitCode.CONFLICT

    def __init__(self, message: str, key: str, holder: LeaseInfo | None = None) -> None:
        self.key, self.holder = key, holder
        super().__init__(message)


class LockLost(LeaseLost):
    """The Python API: the lease was lost while the block ran. ``detected_by`` says how
    (``rejected``, ``unreachable``, ``max-lifetime``, ``resumed-late``, ``replaced``)."""

    def __init__(self, key: str, fencing_token: int | None, detected_by: str, detail: str):
        self.key, self.fencing_token = key, fencing_token
        self.detected_by, self.detail = str(detected_by), detail
        super().__init__(f"lost the lease on {key!r} ({self.detected_by}: {detail})")


class CommandNotFound(TasklockError):
    exit_code = ExitCode.NOT_FOUND


class CommandNotExecutable(TasklockError):
    exit_code = ExitCode.NOT_EXECUTABLE


class Interrupted(BaseException):
    """A signal asked us to stop before the command started (say, while waiting).

    Raised from a signal handler, so like KeyboardInterrupt it is no Exception: a store's
    ``except Exception`` / ``except TasklockError`` must not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = ExitCode.SIGNALLED + signum
        super().__init__(f"stopped by {signal_name(signum)} before the command started")
