"""The words of a run's events, in one place: what `tasklock run` and an API lock say on
stderr (text or JSON lines, ``events.EventLog``) as a lease is waited for, acquired,
renewed, refused or lost, and as the command's run ends. The callers decide when; this
module only says what, so an event's wording and fields are found and changed here.

(``released`` stays with the release in ``run.holding``: whether it is said depends on
how the release went.)
"""

from __future__ import annotations

from tasklock_cli.errors import NotGranted
from tasklock_cli.errors import QueueFull
from tasklock_cli.errors import Superseded
from tasklock_cli.errors import TasklockError
from tasklock_cli.events import EventLog
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util.durations import INFINITY
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.times import rfc3339

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from tasklock_cli.run.conflict import Conflict
    from tasklock_cli.run.keeper import LeaseKeeper
    from tasklock_cli.run.options import RunOptions


# -- acquiring --------------------------------------------------------------------------


def emit_waiting(
    events: EventLog,
    key: str,
    wait: float,
    info: LeaseInfo | None,
    holdup_of: Callable[[str], str | None] = lambda key: None,
) -> None:
    """``holdup_of``: what keeps a key when no holder shows (``Store.holdup``), shown and
    put in the event as ``reason``."""
    holdup = None if info else holdup_of(key)
    held_by = f" held by {describe_holder(info)}" if info else ""
    because = f": {holdup}" if holdup else ""
    extra = {"reason": holdup} if holdup else {}
    events.emit(
        "waiting",
        key,
        None,
        f"waiting for {key!r}{held_by}{because}",
        wait=wait if wait < INFINITY else "inf",
        holder=info.holder.to_dict() if info else None,
        **extra,
    )


def describe_holder(info: LeaseInfo) -> str:
    """``run.conflict.describe_holder``, imported when a holder is described (not by a run
    that gets its lock)."""
    from tasklock_cli.run.conflict import describe_holder as described

    return described(info)


def emit_replacing(events: EventLog, key: str, broken: list[LeaseInfo]) -> None:
    """--replace broke these leases: their holders terminate their trees and let go."""
    for info in broken:
        events.debug(f"--replace: broke {key!r} held by {describe_holder(info)}; taking it next")


def emit_acquired(events: EventLog, options: RunOptions, keeper: LeaseKeeper) -> None:
    lease = keeper.lease
    assert lease is not None
    slot = f" slot {lease.slot} of {lease.limit}" if lease.limit > 1 else ""
    fields: dict[str, object] = {"slot": lease.slot} if lease.limit > 1 else {}
    if lease.mode == SHARED:
        slot, fields["mode"] = " (shared)", SHARED
    events.emit(
        "acquired",
        keeper.key,
        lease.fencing_token,
        f"acquired {keeper.key!r}{slot} (fencing token {lease.fencing_token}, "
        f"ttl {format_duration(options.ttl)})",
        expires_at=rfc3339(lease.expires_at),
        **fields,
    )


def emit_conflict(events: EventLog, key: str, conflict: Conflict) -> None:
    info = conflict.holder
    extra = {"reason": conflict.holdup} if conflict.holdup else {}
    events.emit(
        "conflict",
        key,
        info.fencing_token if info else None,
        f"{conflict}; not running the command",
        holder=info.holder.to_dict() if info else None,
        expires_at=rfc3339(info.expires_at) if info else None,
        **extra,
    )


def emit_refusal(events: EventLog, refused: NotGranted) -> None:
    """The lock was not acquired: a ``conflict`` event (reason ``queue-full`` for a full
    queue), or ``superseded``."""
    if isinstance(refused, Superseded):
        events.emit("superseded", refused.key, None, str(refused))
    elif isinstance(refused, QueueFull):
        message = f"{refused}; not running the command"
        events.emit("conflict", refused.key, None, message, reason=refused.reason)
    else:
        from tasklock_cli.run.conflict import Conflict

        assert isinstance(refused, Conflict)
        emit_conflict(events, refused.key, refused)


def emit_done_already(events: EventLog, key: str, token: int | None, success: RunRecord) -> None:
    events.emit(
        "done-already",
        key,
        token,
        f"{key!r} already succeeded in this --once-per window (fencing token "
        f"{success.fencing_token}, started {rfc3339(success.started_at)}); "
        "not running the command",
        done_by=success.fencing_token,
        done_at=rfc3339(success.started_at),
    )


# -- holding ----------------------------------------------------------------------------


def emit_renewed(events: EventLog, lease: Lease) -> None:
    """The ``renewed`` event, as the CLI's run and an API lock emit it."""
    events.emit(
        "renewed",
        lease.key,
        lease.fencing_token,
        f"renewed {lease.key!r} until {rfc3339(lease.expires_at)}",
        expires_at=rfc3339(lease.expires_at),
    )


def emit_lost(
    events: EventLog, keeper: LeaseKeeper, detected_by: str, detail: str, then: str = ""
) -> None:
    """The ``lost`` event of ``keeper``'s lease; ``then`` says what follows (the CLI
    terminates its command)."""
    message = f"lost the lease on {keeper.key!r} ({detected_by}: {detail}){then}"
    token = keeper.fencing_token
    events.emit("lost", keeper.key, token, message, detected_by=detected_by, detail=detail)


def ledger_warning(events: EventLog, keeper: LeaseKeeper) -> Callable[[TasklockError], None]:
    """What to say when writing the run's record for ``keeper`` failed (and with it that
    release): the release is retried without it, and the command's exit code stands."""

    def warn(exc: TasklockError) -> None:
        events.warning(
            f"could not write the run of {keeper.key!r} to the run ledger ({exc}); "
            "releasing without it",
            key=keeper.key,
            fencing_token=keeper.fencing_token,
        )

    return warn


# -- the command's end ------------------------------------------------------------------


def ran_late(late: float) -> str:
    """The loss's detail when the command exited ``late`` seconds past the local deadline."""
    return f"the command ran {format_duration(late)} past the local lease deadline"


def emit_guard_died(events: EventLog, key: str) -> None:
    events.error(f"the guard of the command on {key!r} died; the command's process tree was killed")


def emit_killing_after_grace(events: EventLog, grace: float) -> None:
    events.debug(f"ignored SIGTERM for {format_duration(grace)}; sending SIGKILL")


def emit_orphans_terminated(events: EventLog, keeper: LeaseKeeper, count: int) -> None:
    message = f"terminated {count} process{'' if count == 1 else 'es'} the command left running"
    events.emit("orphans-terminated", keeper.key, keeper.fencing_token, message, count=count)
