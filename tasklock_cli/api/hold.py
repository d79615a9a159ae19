"""One ``Locks.lock()`` from acquire to release: the CLI's lease engine, in-process.

The leases are taken, renewed and released by the same pieces as ``tasklock run``'s:
``LeaseKeeper`` (deadline, renewal, release), ``Heartbeat`` (the renewal thread, which
also hears of forced releases), ``Waiter`` (waiting in the store's queue) and ``Holding``
(``also`` keys, taken in one global order). What the supervisor's main thread does for a
command, a watcher thread does here: it tells from the clock alone when a lease must be
given up (``loss_by_now``: a renewal deadline passed, a pause, ``max_lifetime``). There
is no command to terminate: a loss sets ``lost`` and calls the loss callbacks (an
``async with`` block's task is cancelled through one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from datetime import datetime

from tasklock_cli.errors import LockLost
from tasklock_cli.errors import LockNotAcquired
from tasklock_cli.events import EventLog
from tasklock_cli.run.announce import emit_acquired
from tasklock_cli.run.announce import emit_conflict
from tasklock_cli.run.announce import emit_lost
from tasklock_cli.run.announce import emit_renewed
from tasklock_cli.run.announce import emit_waiting
from tasklock_cli.run.conflict import Conflict
from tasklock_cli.run.heartbeat import Heartbeat
from tasklock_cli.run.holding import Holding
from tasklock_cli.run.holding import Loss
from tasklock_cli.run.holding import keepers_of_run
from tasklock_cli.run.holding import loss_by_now
from tasklock_cli.run.holding import release_held
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.options import RunOptions
from tasklock_cli.run.waiter import Waiter
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Lease as StoreLease
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util import clock as clocks
from tasklock_cli.util.records import replace

#: The watcher looks at the clock at least this often (a ManualClock's step wakes it too).
WATCH_CEILING_S = 1.0


class LeaseHold:
    """The leases of one ``lock()``: acquire, keep, lose, release (each once)."""

    def __init__(
        self,
        open_store: Callable[[], Store],
        options: RunOptions,
        events: EventLog,
        clock: clocks.Clock = clocks.monotonic,
    ) -> None:
        self.open_store, self.events, self.clock = open_store, events, clock
        self.store = open_store()
        try:
            others = [open_store() for _ in options.also]
        except BaseException:
            self.store.close()
            raise
        options = replace(options, failover_window=self.store.failover_window)
        self.options = options
        keepers = keepers_of_run([self.store, *others], options, clock)
        self.keeper = keepers[0]
        self.loss: Loss | None = None
        self.lost = threading.Event()
        self.expires_at: datetime | None = None
        self._on_loss: list[Callable[[], None]] = []
        self._loss_lock = threading.Lock()
        self._look = threading.Event()  # wakes the watcher
        self._ended = threading.Event()
        self._waiter: Waiter | None = None
        self._cancelled = False  # cancel_waiting was called (before or during the wait)
        self._cancel_lock = threading.Lock()
        self._cancel_r, self._cancel_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._check_store: Store | None = None
        self._watcher = threading.Thread(target=self._watch, name="tasklock-watch", daemon=True)
        self.started = 0.0
        self.holding = Holding(keepers, self._heartbeat_of, others)

    def _heartbeat_of(self, keeper: LeaseKeeper) -> Heartbeat:
        return Heartbeat(
            keeper,
            self.options,
            self.events,
            on_loss=lambda kind, detail, _kill_at: self.lose(kind, detail),
            on_renewed=self._renewed,
            on_deadline=self._look.set,
            clock=self.clock,
        )

    # -- acquiring ------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take every lease (waiting as ``options.wait`` allows) and start keeping them;
        LockNotAcquired when they are held elsewhere. On any failure nothing is held and
        the stores are closed."""
        options, io_timeout = self.options, self.options.schedule.io_timeout
        self.holding.set_io_timeout(io_timeout)
        try:
            self.holding.take_all(options.wait, self._waiter_for)
            self.holding.ensure_remaining(options.lease_window / 2, io_timeout)
        except Conflict as conflict:
            self._give_up()
            emit_conflict(self.events, conflict.key, conflict)
            raise LockNotAcquired(str(conflict), conflict.key, conflict.holder) from None
        except BaseException:
            self._give_up()
            raise
        for keeper in self.holding.in_order:
            emit_acquired(self.events, options, keeper)
        self.expires_at = self.keeper.lease.expires_at if self.keeper.lease else None
        self.started = self.clock()
        self.holding.note_processes(os.getpid())  # no guard: this process holds it
        self.holding.start(os.getpid())
        self._watcher.start()

    def _waiter_for(self, keeper: LeaseKeeper, wait: float) -> Waiter:
        def announce(info: object) -> None:
            emit_waiting(self.events, keeper.key, self.options.wait, info, keeper.store.holdup)  # type: ignore[arg-type]

        waiter = Waiter(keeper, wait, on_waiting=announce, wake_fd=self._cancel_r)
        with self._cancel_lock:
            self._waiter = waiter
            if self._cancelled:  # came before this waiter existed
                waiter.interrupt(signal.SIGINT)
        return waiter

    def cancel_waiting(self) -> None:
        """Stop an acquire under way in another thread (its task was cancelled), or one
        about to begin: it gives back what it took and raises ``errors.Interrupted``."""
        with self._cancel_lock:
            self._cancelled = True
            with contextlib.suppress(OSError):
                os.write(self._cancel_w, b"!")
            if self._waiter is not None:
                self._waiter.interrupt(signal.SIGINT)

    def _give_up(self) -> None:
        with contextlib.suppress(Exception):
            self.holding.give_back(self.options.schedule.io_timeout)
        self._close()

    # -- holding --------------------------------------------------------------------------

    def _watch(self) -> None:
        """What the clock alone says: the lease is lost once a renewal deadline is near
        or passed (we could not renew, or were paused) or max_lifetime is reached."""
        stop_listening = _listen(self.clock, self._look.set)
        try:
            while not self._ended.is_set() and self.loss is None:
                now = self.clock()
                found = loss_by_now(self.options, now, self.holding.deadline(), self.started)
                if found is not None:
                    self.lose(found.detected_by, found.detail)
                    return
                self._look.wait(self._next_look(now))
                self._look.clear()
        finally:
            stop_listening()

    def _next_look(self, now: float) -> float:
        options, deadline = self.options, self.holding.deadline()
        schedule = options.schedule
        wake_times = [
            deadline - schedule.safety_margin - options.loss_grace,
            deadline,
            self.started + options.max_lifetime,
        ]
        return min(max(min(wake_times) - now, 0.0), WATCH_CEILING_S)

    def _renewed(self, lease: StoreLease) -> None:
        if lease.key == self.keeper.key:
            self.expires_at = lease.expires_at
        emit_renewed(self.events, lease)

    def on_loss(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from another thread) when the lease is lost; at once when it
        is lost already."""
        with self._loss_lock:
            self._on_loss.append(callback)
            lost = self.loss is not None
        if lost:
            callback()

    def no_more_callbacks(self) -> None:
        with self._loss_lock:
            self._on_loss.clear()

    def lose(self, detected_by: str, detail: str) -> None:
        """The lease is lost (the first loss counts): ``lost`` is set and the callbacks
        called at once; the leases are still released when the block is left."""
        with self._loss_lock:
            if self.loss is not None:
                return
            self.loss = Loss(detected_by, detail, 0.0)
            callbacks = list(self._on_loss)
        self.lost.set()
        emit_lost(self.events, self.keeper, detected_by, detail)
        for callback in callbacks:
            with contextlib.suppress(Exception):
                callback()
        self._look.set()

    def lost_error(self) -> LockLost:
        assert self.loss is not None
        loss = self.loss
        return LockLost(self.options.key, self.fencing_token, loss.detected_by, loss.detail)

    @property
    def fencing_token(self) -> int | None:
        return self.keeper.fencing_token if self.keeper.lease else self._token

    _token: int | None = None

    def time_left(self) -> float | None:
        """Seconds left of the lease on the store (a round trip on a client of its own, as
        the heartbeat's serves the heartbeat); None when it is no longer current."""
        if self._check_store is None:
            self._check_store = self.open_store()
        token = self.fencing_token
        return None if token is None else self._check_store.time_left(self.options.key, token)

    # -- releasing ------------------------------------------------------------------------

    def release(self, outcome: str, exit_code: int | None) -> None:
        """Stop keeping the leases and release them, each with its run record (``outcome``,
        or ``lost`` after a loss); then close every store."""
        self._token = self.keeper.fencing_token
        self._ended.set()
        self._look.set()
        io_timeout = self.options.schedule.io_timeout
        self.holding.stop(join_within=io_timeout)
        try:
            loss = self.loss
            records: dict[str, RunRecord | None] = {
                k.key: (
                    k.run_record("lost", None, str(loss.detected_by))
                    if loss is not None
                    else k.run_record(outcome, exit_code)
                )
                for k in self.holding.in_order
            }
            release_held(self.holding, self.options, self.events, records, loss)
        finally:
            self.holding.join(io_timeout)
            if self._watcher.is_alive():
                self._watcher.join(io_timeout)
            self._close()

    def _close(self) -> None:
        self.holding.close()
        for store in (self.store, self._check_store):
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
        for fd in (self._cancel_r, self._cancel_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _listen(clock: clocks.Clock, wake: Callable[[], None]) -> Callable[[], None]:
    """Have a ManualClock's steps wake the watcher; what stops that."""
    on_advance = getattr(clock, "on_advance", None)
    if on_advance is None:
        return lambda: None
    stop: Callable[[], None] = on_advance(wake)
    return stop
