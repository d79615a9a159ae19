"""The leases one `run` holds: KEY's, and with ``--also`` each further key's.

Every key has its own LeaseKeeper and Heartbeat (and, beyond KEY, a store client of its
own: a client serves one thread). They are taken in one global order, sorted by key, so
two runs naming the same keys in any order never wait for each other in a circle. The run
is as safe as its weakest lease: the local deadline is the earliest of them, and losing
any one is losing the lock.

Below ``Holding``, what holding leases involves besides supervising a command, shared by
`tasklock run` (``run.supervisor``) and the Python API (``tasklock_cli.api``): who the
holder is, what the clock alone says about a lease held (``loss_by_now``), releasing
(``release_held``, with its ``released`` event; the other events' words are in
``run.announce``). (Here rather than in a module of its
own: a module more on `run`'s path is start-up time, see tests/test_fastrun.py.)
"""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost ~2 ms per start
import os

from tasklock_cli.errors import LossKind
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.events import EventLog
from tasklock_cli.run.announce import ledger_warning
from tasklock_cli.run.heartbeat import Heartbeat
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.options import RunOptions
from tasklock_cli.run.waiter import Waiter
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util import clock as clocks
from tasklock_cli.util import suppressed
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import replace
from tasklock_cli.util.sanitize import recordable

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class Holding:
    def __init__(
        self,
        keepers: list[LeaseKeeper],
        make_heartbeat: Callable[[LeaseKeeper], Heartbeat],
        own_stores: list[Store],
    ) -> None:
        self.primary = keepers[0]  # KEY's: the lease the run's events and variables name
        self.in_order = sorted(keepers, key=lambda keeper: keeper.key)
        self.heartbeats = [make_heartbeat(keeper) for keeper in keepers]
        self._own_stores = own_stores  # opened for the --also keys: closed with us

    @property
    def several(self) -> bool:
        return len(self.in_order) > 1

    def take_all(self, wait: float, waiter_for: Callable[[LeaseKeeper, float], Waiter]) -> None:
        """Take every lease in key order, each through its ``waiter_for(keeper, wait)``,
        holding those taken while waiting for the next, all within ``wait`` seconds. On
        failure the leases taken are still held: ``give_back`` returns them."""
        clock = self.primary.clock
        give_up_at = clock() + wait
        for index, keeper in enumerate(self.in_order):
            left = wait if index == 0 else max(0.0, give_up_at - clock())
            waiter_for(keeper, left).acquire()

    def ensure_remaining(self, at_least: float, io_timeout: float) -> None:
        for keeper in self.in_order:
            keeper.ensure_remaining(at_least, io_timeout)

    def deadline(self) -> float:
        """The earliest local deadline of the leases held: the run's."""
        return min(keeper.deadline for keeper in self.held())

    def acquired_at(self) -> float:
        """When the last lease was taken: the run holds its keys from then on."""
        return max(keeper.acquired_at for keeper in self.in_order)

    def held(self) -> list[LeaseKeeper]:
        return [keeper for keeper in self.in_order if keeper.lease is not None]

    def tokens(self) -> dict[str, int]:
        """Key -> fencing token of every lease held (TASKLOCK_FENCING_TOKENS)."""
        return {
            keeper.key: keeper.lease.fencing_token
            for keeper in self.in_order
            if keeper.lease is not None  # the held ones (held())
        }

    def records(self, outcome: str, exit_code: int | None) -> dict[str, RunRecord | None]:
        """Each key's run record of the run (None for a key not held)."""
        return {keeper.key: keeper.run_record(outcome, exit_code) for keeper in self.in_order}

    def set_io_timeout(self, seconds: float) -> None:
        for keeper in self.in_order:
            keeper.store.set_io_timeout(seconds)

    def run_under(self, guard_pid: int) -> None:
        """The leases are for a command under this guard, forked before the acquire: each
        holder names it, so a store that can tell when a local holder is gone records both
        processes with the acquire (``Holder.guard_pid``)."""
        for keeper in self.in_order:
            keeper.holder = replace(keeper.holder, guard_pid=guard_pid)

    def note_processes(self, guard_pid: int) -> None:
        """Record with every lease this process and the command's guard, before the
        command starts, where the store can later tell they are gone: a holder killed at
        any instant after its command started is seen as gone by `release --force`."""
        for heartbeat in self.heartbeats:
            heartbeat.guard_pid = guard_pid
            heartbeat.note_processes()

    def start(self, guard_pid: int) -> None:
        for heartbeat in self.heartbeats:
            heartbeat.guard_pid = guard_pid
            heartbeat.start()

    def stop(self, join_within: float) -> None:
        """Stop every heartbeat's reports, and end those whose store cannot release beside
        a heartbeat. The others are woken and joined after the release (``join``): waking
        one now would have it wind down on our CPU and our lock while we release."""
        for heartbeat in self.heartbeats:
            heartbeat.stop_reports()
        for heartbeat in self.heartbeats:
            if not heartbeat.store.concurrent_release:
                heartbeat.join(join_within)

    def join(self, within: float) -> None:
        for heartbeat in self.heartbeats:
            heartbeat.join(within)

    def release_quietly(
        self, io_timeout: float, records: dict[str, RunRecord | None], on_ledger_failed
    ) -> list[LeaseKeeper]:
        """One try at releasing each lease held, with its run record; the keepers whose
        release the store confirmed."""
        return [
            keeper
            for keeper in self.held()
            if keeper.release_quietly(io_timeout, records.get(keeper.key), on_ledger_failed)
        ]

    def give_back(self, io_timeout: float) -> None:
        """Release what an acquisition that failed half-way took (no run to record)."""
        self.release_quietly(io_timeout, {}, None)

    def close(self) -> None:
        for heartbeat in self.heartbeats:
            heartbeat.close()
        for store in self._own_stores:
            with suppressed(Exception):
                store.close()


# -- what holding leases involves besides supervising a command ------------------------
#
# Shared by `tasklock run` (run.supervisor) and the Python API (tasklock_cli.api): who the
# holder is, what the clock alone says about a lease held, releasing and its events.


@dataclass
class Loss:
    detected_by: str
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


def keepers_of_run(
    stores: list[Store], options: RunOptions, clock: clocks.Clock
) -> list[LeaseKeeper]:
    """A keeper for KEY on ``stores[0]`` and one for each ``--also`` key on the next store
    (a client serves one thread), each holding as us (``current_holder``)."""
    holder = current_holder(options.command, options.note, options.record_args)
    keys = [options.key, *options.also]
    return [
        LeaseKeeper.of_run(store, key, options, holder, clock)
        for store, key in zip(stores, keys, strict=True)
    ]


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
            ledger_warning(events, keeper),
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
        on_failed = ledger_warning(events, holding.primary)
        for k in holding.release_quietly(options.schedule.io_timeout, records, on_failed):
            events.emit("released", k.key, k.fencing_token, f"released {k.key!r}")
        return
    for keeper in holding.held():
        release_and_report(keeper, options, events, keep_for, records[keeper.key])
