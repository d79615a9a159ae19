"""Acquiring with waiting: a place in the key's queue (``--priority``, ``--max-waiting``,
``--supersede``), retries with back-off between the store's wake-ups, ``--replace``'s
breaks, when a ``waiting`` report is due (``on_waiting``: the caller emits the event), and
the ``Conflict`` when the wait runs out."""

from __future__ import annotations

import os

from tasklock_cli.errors import Interrupted
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import Replacer
from tasklock_cli.util import suppressed

# Waiting: first retry soon, then back off; stores that signal releases wake us earlier.
FIRST_RETRY_S = 0.005
POLL_CEILING_S = 0.05
SIGNALLED_POLL_CEILING_S = 1.0
#: Where the wait itself keeps a waiter's place and its wake-ups cannot be lost
#: (``Store.waits_keep_places``), a plain waiter looks again this seldom: the look only
#: backs the wake-up up. (--supersede and --replace waiters still look every second: a
#: superseded place is found by a look.)
QUIET_LOOK_CEILING_S = 5.0
#: While waiting, the ``waiting`` event (naming the current holder) repeats this often, so
#: a CI log shows why a step is stuck.
WAITING_EVENT_EVERY_S = 30.0


def _random_fraction() -> float:
    import random  # only when waiting: ~1 ms of start-up otherwise

    return random.random()


class Waiter:
    """Retries an acquisition until it succeeds or ``wait`` seconds have passed.

    ``supersede`` (``run --supersede``): a newer such waiter of the key makes this one give
    up (``Superseded``).

    ``replace`` (``run --replace``):

    - The holders are broken, as ``release --force`` does.
    - This waiter waits ahead of every other one.
    - It waits beyond ``wait`` for as long as a lease it broke (or a newcomer's) is still
      live.
    - So it takes the key as soon as they let go or their leases run out.

    ``priority`` and ``max_waiting`` (``run --priority``, ``--max-waiting``): its place's
    rank in the queue, and the queue length at which it does not join (``QueueFull``)."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        wait: float,
        on_waiting=None,
        rng=None,
        wake_fd: int | None = None,
        supersede: bool = False,
        replace: bool = False,
        on_broken=None,
        priority: int = 0,
        max_waiting: int | None = None,
    ):
        self.keeper = keeper
        self.wait = wait
        self.on_waiting = on_waiting
        self.rng = rng or _random_fraction
        self.wake_fd = wake_fd  # readable when a signal came (signal.set_wakeup_fd)
        self.supersede = supersede
        self.replace = replace
        self.on_broken = on_broken  # called with the leases a --replace broke, each once
        self._broken: set[int] = set()
        self.priority = priority
        self.max_waiting = max_waiting
        store = keeper.store
        if store.waits_keep_places and not (supersede or replace):
            self.ceiling = QUIET_LOOK_CEILING_S
        else:
            ceiling = SIGNALLED_POLL_CEILING_S if store.signals_release else POLL_CEILING_S
            # each attempt renews our place in the queue: several per waiter_ttl
            self.ceiling = min(ceiling, store.waiter_ttl / 3)
        self._stop_signal: int | None = None
        self._in_wait = False

    def interrupt(self, signum: int) -> None:
        """Stop waiting (from a signal handler). With a ``wake_fd`` the store's wait
        returns by itself, and the wait stops right after; without one, at once when
        blocked in the store's wait, else before the next one. A store call under way is
        not cut short here (the caller decides), so a lease it grants is not lost track
        of: the caller finds it held and releases it. After an interrupted wait the caller
        must close the store."""
        self._stop_signal = signum
        if self._in_wait and self.wake_fd is None:
            self._in_wait = False  # once: a second signal must not cut the unwinding short
            raise Interrupted(signum)

    def acquire(self) -> None:
        try:
            self._acquire()
        except TasklockError:
            # The wait ran out or the store failed: a store kept open must not go on
            # holding this waiter's place. (A wait cut short by a signal may have left a
            # store call half done: the caller closes that store, which gives all up.)
            with suppressed(TasklockError):
                self.keeper.store.stop_waiting(self.keeper.key)
            raise

    def _acquire(self) -> None:
        keeper, clock = self.keeper, self.keeper.clock
        give_up_at = clock() + self.wait
        delay = FIRST_RETRY_S
        announced_at: float | None = None
        first_holder: LeaseInfo | None = None
        broken_live = broken_live_before = False
        while True:
            try:
                queue = self.wait > 0 or self.replace
                if keeper.try_acquire(
                    queue,
                    supersede=self.supersede,
                    front=self.replace,
                    priority=self.priority,
                    max_waiting=self.max_waiting,
                ):
                    return
                broken_live = self._break_holders() or self._quarantined()
            except StoreUnavailable:
                if clock() + delay >= give_up_at:
                    raise
                # a blip while waiting is retried like a conflict
            left = give_up_at - clock()
            # --replace waits while a lease it broke is live (or a failover quarantine keeps
            # out every key: an old primary's lease may still run), and tries once more after
            replacing, broken_live_before = broken_live or broken_live_before, broken_live
            if left <= 0 and not replacing:
                waited = self.wait if announced_at is not None else 0.0
                holder = self._current_holder()
                holdup = keeper.store.holdup(keeper.key)
                from tasklock_cli.run.conflict import Conflict

                raise Conflict(keeper.key, holder, waited, first_holder, holdup)
            if announced_at is None or clock() - announced_at >= WAITING_EVENT_EVERY_S:
                holder = self._current_holder()
                if announced_at is None:
                    first_holder = holder
                announced_at = clock()
                if self.on_waiting is not None:
                    self.on_waiting(holder)
            # (past the wait only while --replace waits for a lease it broke; never past the
            # next `waiting` event)
            announce_in = announced_at + WAITING_EVENT_EVERY_S - clock()
            wait = min(delay * (0.5 + self.rng()), left if left > 0 else delay, announce_in)
            self._wait_for_release(wait)
            delay = min(delay * 2, self.ceiling)

    def _break_holders(self) -> bool:
        """--replace: break the key's live leases in our name; True when there were any
        (they are broken now, and we wait for them to let go or run out)."""
        if not self.replace:
            return False
        keeper = self.keeper
        live = keeper.store.break_lease(keeper.key, None, Replacer.of(keeper.holder))
        fresh = [info for info in live if info.fencing_token not in self._broken]
        self._broken.update(info.fencing_token for info in fresh)
        if fresh and self.on_broken is not None:
            self.on_broken(fresh)
        return bool(live)

    def _quarantined(self) -> bool:
        """--replace: our last acquire met a failover quarantine (``Store.holdup``), which
        keeps the key until every lease the old primary may have granted has run out."""
        return self.replace and self.keeper.store.holdup(self.keeper.key) is not None

    def _wait_for_release(self, timeout: float) -> None:
        self._in_wait = True
        try:
            if self._stop_signal is not None:  # it came during the last store call
                raise Interrupted(self._stop_signal)
            self.keeper.store.wait_for_release(self.keeper.key, timeout, self.wake_fd)
        finally:
            self._in_wait = False
        if self._stop_signal is not None:
            raise Interrupted(self._stop_signal)
        _drain(self.wake_fd)  # another signal (SIGCHLD, SIGCONT): wait on

    def _current_holder(self) -> LeaseInfo | None:
        try:
            return self.keeper.store.peek(self.keeper.key)
        except TasklockError:
            return None


def _drain(fd: int | None) -> None:
    if fd is None:
        return
    with suppressed(BlockingIOError, OSError):
        while os.read(fd, 512):
            pass
