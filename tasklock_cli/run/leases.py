"""What holding leases involves besides supervising a command: who the holder is, what
the clock alone says about a lease held, releasing and the events that report it.

``tasklock run`` (``run.supervisor``) and the Python API (``tasklock_cli.api``) both hold
leases through ``LeaseKeeper``, ``Heartbeat`` and ``Waiter``; this module is the rest they
share, so that neither has a second version of it.
"""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost ~2 ms per start
import functools
import math
import os
from collections.abc import Callable

from tasklock_cli.errors import LossKind
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.events import EventLog
from tasklock_cli.run.conflict import Conflict
from tasklock_cli.run.conflict import describe_holder
from tasklock_cli.run.holding import Holding
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.options import RunOptions
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import replace
from tasklock_cli.util.sanitize import recordable
from tasklock_cli.util.times import rfc3339


@dataclass
class Loss:
    detected_by: LossKind
    detail: str
    kill_at: float  # clock time of the SIGKILL


def current_holder(command: list[str], note: str | None, record_args: bool = True) -> Holder:
    """Who we are, as the store keeps it: the command (only its first word without
    ``record_args``) and note recorded losslessly as UTF-8."""
    kept = command if record_args else command[:1]
    return Holder(
        host=_socket.gethostname(),
        pid=os.getpid(),
        user=user_name(),
        command=[recordable(arg) for arg in kept],
        note=None if note is None else recordable(note),
    )


def user_name() -> str:
    """The name of our real uid (its number when it has none): not ``$LOGNAME``, which
    anyone can set."""
    import pwd  # built in: no cost worth deferring, but only a run needs it

    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def loss_by_now(options: RunOptions, now: float, deadline: float, started: float) -> Loss | None:
    """What the clock alone says while the command runs: the lease is lost when ``now`` is
    past the local ``deadline`` (this process was not running: SIGSTOP, a VM freeze) or so
    close to it that the tree must be terminated now, or --max-lifetime is reached."""
    if now >= deadline:
        late = format_duration(now - deadline)
        return Loss(LossKind.RESUMED_LATE, f"resumed {late} past the local lease deadline", now)
    margin = options.schedule.safety_margin
    if now >= deadline - margin - options.loss_grace:
        return Loss(LossKind.UNREACHABLE, "could not renew the lease in time", deadline - margin)
    if now - started >= options.max_lifetime:
        reached = f"reached --max-lifetime {format_duration(options.max_lifetime)}"
        return Loss(LossKind.MAX_LIFETIME, reached, now + options.grace)
    return None


def with_breaker(
    store: Store, lease: Lease | None, record: RunRecord | None, debug: Callable[[str], None]
) -> RunRecord | None:
    """``record`` naming who broke the lease (``broken_by``), when the store says."""
    if record is None or lease is None:
        return record
    try:
        by = store.broken_by(lease)
    except TasklockError as exc:
        debug(f"could not read who broke {lease.key!r}: {exc}")
        return record
    if not by:
        return record
    # (the record says ``replaced`` in its detected_by; broken_by names who)
    return replace(record, broken_by={name: by[name] for name in ("host", "pid", "user")})


def release_and_report(
    keeper: LeaseKeeper,
    options: RunOptions,
    events: EventLog,
    keep_for: float = 0.0,
    record: RunRecord | None = None,
) -> None:
    """Release, retrying while the lease could still be ours; never claim a false release."""
    key, token = keeper.key, keeper.fencing_token
    try:
        released = keeper.release_retrying(
            keep_for,
            options.schedule.io_timeout,
            options.schedule.renew_retry_interval,
            events.debug,
            record,
            functools.partial(warn_ledger_failed, events, keeper),
        )
    except StoreUnavailable as exc:
        events.error(
            f"could not release {key!r} ({exc}); it expires on its own "
            f"within {format_duration(max(0.0, keeper.remaining()))}"
        )
        return
    if not released:
        events.debug(f"{key!r} was no longer held by us at release")
        return
    held = f", held for {format_duration(keep_for)} more (--hold-at-least)" if keep_for else ""
    events.emit("released", key, token, f"released {key!r}{held}", kept_for=keep_for)


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


def warn_ledger_failed(events: EventLog, keeper: LeaseKeeper, exc: TasklockError) -> None:
    """Writing the run's record failed (and with it that release): the release is retried
    without it, and the command's exit code stands."""
    events.warning(
        f"could not write the run of {keeper.key!r} to the run ledger ({exc}); "
        "releasing without it",
        key=keeper.key,
        fencing_token=keeper.fencing_token,
    )


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
        wait=wait if math.isfinite(wait) else "inf",
        holder=info.holder.to_dict() if info else None,
        **extra,
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


#: Losses after which the store may say who broke the lease (``broken_by``).
_MAYBE_BROKEN = (LossKind.REJECTED, LossKind.REPLACED, LossKind.RESUMED_LATE)


def release_held(
    holding: Holding,
    options: RunOptions,
    events: EventLog,
    records: dict[str, RunRecord | None],
    loss: Loss | None,
    keep_for: float = 0.0,
) -> None:
    """Release every lease ``holding`` holds, each writing its key's run record; after a
    loss the records name who broke the lease, when the store says."""
    if loss is not None and loss.detected_by in _MAYBE_BROKEN:
        # Maybe broken by an operator (a paused holder finds its broken lease still
        # there until it runs out on the store's clock).
        for k in holding.held():
            records[k.key] = with_breaker(k.store, k.lease, records[k.key], events.debug)
    if loss is not None and loss.detected_by in (LossKind.REJECTED, LossKind.REPLACED):
        # Broken by an operator: still ours to let go, token-checked, unless someone
        # else holds it by now (then this frees nothing). One try: it is not ours to keep.
        on_failed = functools.partial(warn_ledger_failed, events, holding.primary)
        for k in holding.release_quietly(options.schedule.io_timeout, records, on_failed):
            events.emit("released", k.key, k.fencing_token, f"released {k.key!r}")
        return
    for keeper in holding.held():
        release_and_report(keeper, options, events, keep_for, records[keeper.key])
