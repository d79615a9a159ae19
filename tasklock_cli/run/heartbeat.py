"""The heartbeat: a thread that renews the lease until told to stop, and between renewals
listens for the store telling it the lease was broken (then renews at once, which the
store rejects). What it finds goes to the supervisor through callbacks.

A notification is a hint, not a fact: anyone who can write to the store can send one. It
is acted on by renewing, token-checked, and no more often than once per retry interval;
a renewal that succeeds contradicts it, and the store's watch has consumed it."""

from __future__ import annotations

import _thread
import os

from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import LossKind
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.events import EventLog
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.options import RunOptions
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Lease
from tasklock_cli.util import clock as clocks
from tasklock_cli.util import suppressed
from tasklock_cli.util.fds import wait_readable
from tasklock_cli.util.threads import DaemonThread
from tasklock_cli.util.threads import Flag

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

#: A lease broken by an operator: the command gets at most this long between SIGTERM and
#: SIGKILL, so that `release --force` (which waits 10 s) sees the holder let go.
BROKEN_GRACE_CAP_S = 8.0
#: The first wait for a break begins this long after the lease was taken, or at the first
#: renewal if sooner. A command that ends sooner (most cron jobs) never opens a break watch:
#: no second connection on PostgreSQL and Redis, no FIFO on SQLite, no GIL hand-overs for
#: this thread. A break in that time is still seen: the watch looks at the lease as it opens.
QUIET_START_S = 0.1


class Heartbeat:
    def __init__(
        self,
        keeper: LeaseKeeper,
        options: RunOptions,
        events: EventLog,
        on_loss: Callable[[str, str, float], None],
        on_renewed: Callable[[Lease], None],
        on_deadline: Callable[[], None],
        clock: clocks.Clock = clocks.monotonic,
    ) -> None:
        self.keeper = keeper
        self.store: Store = keeper.store
        self.options = options
        self.events = events
        self.on_loss = on_loss
        self.on_renewed = on_renewed
        self.on_deadline = on_deadline
        self.clock = clock
        self.stopped = Flag()
        #: The command's guard, whose pid the store records with the lease (set before start).
        self.guard_pid: int | None = None
        self._hint_renewal_not_before = 0.0
        self._reporting = _thread.allocate_lock()  # held over a renewal and its report
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = DaemonThread(self._run)

    def start(self) -> None:
        self._thread.start()

    def stop(self, join_within: float | None = None) -> None:
        """Stop (any wait for a break ends at once); join when ``join_within`` is given."""
        self.stop_reports()
        if join_within is None:
            self._wake()
        else:
            self.join(join_within)  # (wakes it first)

    def stop_reports(self) -> None:
        """From now on the supervisor hears nothing from this thread: a renewal under way
        is finished and reported first (a loss it finds counts), and none begins after.
        The thread itself is not woken: it ends at its next wake-up, or at ``join``."""
        self.stopped.set()
        with self._reporting:
            pass

    def join(self, within: float) -> None:
        """Wake the thread if it still waits, and wait up to ``within`` for it to end."""
        self._wake()
        if self._thread.is_alive():
            self._thread.join(within)

    def _wake(self) -> None:
        with suppressed(BlockingIOError, OSError):
            os.write(self._stop_w, b"!")

    def close(self) -> None:
        self.stop()
        for fd in (self._stop_r, self._stop_w):
            os.close(fd)

    def _run(self) -> None:
        options = self.options
        next_renewal = self.keeper.acquired_at + options.schedule.renew_interval
        if self._quiet_start(next_renewal):
            return
        while not self._until_renewal(next_renewal):
            # A renewal and what it finds are one step for stop_reports: one under way is
            # finished and reported first, and none begins once stopped.
            with self._reporting:
                if self.stopped.is_set():
                    return
                renewed_by = self._renew_once()
            if renewed_by is None:
                return
            next_renewal = renewed_by

    def _renew_once(self) -> float | None:
        """Renew, and tell the supervisor what came of it; when to renew next, or None
        when the heartbeat ends (the lease is lost, or the local deadline passed)."""
        options = self.options
        if self.clock() >= self.keeper.deadline:
            self.on_deadline()  # the watcher decides: we were paused, or could not renew
            return None
        try:
            lease = self.keeper.renew()
        except LeaseLost as exc:
            grace = min(options.grace, BROKEN_GRACE_CAP_S)
            self.on_loss(*self._rejected(str(exc)), self.clock() + grace)
            return None
        except StoreUnavailable as exc:
            self.events.debug(f"renewal failed, retrying: {exc}")
            return self.clock() + options.schedule.renew_retry_interval
        except Exception as exc:  # a heartbeat that dies silently would let the child run on
            deadline = self.keeper.deadline - options.schedule.safety_margin
            self.on_loss(LossKind.UNREACHABLE, f"renewal failed: {exc!r}", deadline)
            return None
        self.on_renewed(lease)
        return self.clock() + options.schedule.renew_interval

    def _rejected(self, why: str) -> tuple[str, str]:
        """A rejected renewal, and why, naming who broke the lease where the store keeps it
        (``broken_by``): REPLACED when a `run --replace` broke it, else REJECTED. ``why``:
        the store's own words, for a lease nobody is known to have broken (it ran out)."""
        lease = self.keeper.lease
        try:
            by = self.store.broken_by(lease) if lease is not None else None
        except Exception:  # the loss stands; only who caused it is unknown
            by = None
        if not by:
            return LossKind.REJECTED, why
        who = f"{by['host']} pid {by['pid']} (user {by['user']})"
        if by.get("replaced"):
            return LossKind.REPLACED, f"replaced by run --replace from {who}"
        return LossKind.REJECTED, f"broken by release --force from {who}"

    def _quiet_start(self, renew_at: float) -> bool:
        """Wait QUIET_START_S (at most until ``renew_at``) for a stop; True when stopped."""
        quiet_until = min(renew_at, self.keeper.acquired_at + QUIET_START_S)
        wait_readable([self._stop_r], quiet_until - self.clock())
        return self.stopped.is_set()

    def note_processes(self) -> None:
        """Record this process and the guard with the lease (``Store.note_processes``)."""
        lease = self.keeper.lease
        if self.guard_pid is None or lease is None:
            return
        try:
            self.store.note_processes(lease, self.guard_pid)
        except Exception as exc:  # then release --force waits for the lease to run out
            self.events.debug(f"could not record the processes holding {self.options.key!r}: {exc}")

    def _after_hint(self, renew_at: float) -> bool:
        """A break was heard of: renew now, or, when the last hint was acted on less than a
        retry interval ago, then (hints may come in floods); True when stopped meanwhile."""
        now = self.clock()
        act_at = min(renew_at, self._hint_renewal_not_before)
        if act_at > now and self.stopped.wait(act_at - now):
            return True
        self._hint_renewal_not_before = self.clock() + self.options.schedule.renew_retry_interval
        return self.stopped.is_set()

    def _until_renewal(self, renew_at: float) -> bool:
        """Wait until ``renew_at``, or less when the store tells us our lease was broken;
        True when the heartbeat must stop."""
        while not self.stopped.is_set():
            left = renew_at - self.clock()
            lease = self.keeper.lease
            if left <= 0 or lease is None:
                return False
            started = self.clock()
            try:
                if self.store.wait_for_break(lease, left, self._stop_r):
                    if self.stopped.is_set():  # (our own release, heard)
                        return True
                    self.events.debug(f"told {self.options.key!r} was broken: renewing to see")
                    return self._after_hint(renew_at)
            except Exception as exc:  # no notifications, then: sleep, renewals still tell
                self.events.debug(f"cannot listen for a break of {self.options.key!r}: {exc}")
                return self.stopped.wait(max(0.0, renew_at - self.clock()))
            if self.clock() - started < min(left, 0.001):  # returned at once: do not spin
                return self.stopped.wait(max(0.0, renew_at - self.clock()))
        return True
