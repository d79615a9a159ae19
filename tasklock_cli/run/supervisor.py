"""`tasklock run`: hold a lease for exactly as long as a command runs, and never longer.

The main thread watches the child and the clock; a heartbeat thread renews the lease.
Whatever goes wrong with renewals, the child's process group is dead before the local
deadline, which is itself earlier than the store's expiry.

What the run says is worded in ``run.announce``, and what the command is given in
``run.environment``: this module decides when, and what happens to the process tree.
"""

from __future__ import annotations

import _thread
import os
import select

from tasklock_cli.errors import ExitCode
from tasklock_cli.errors import Interrupted
from tasklock_cli.errors import LossKind
from tasklock_cli.errors import NotGranted
from tasklock_cli.errors import TasklockError
from tasklock_cli.events import EventLog
from tasklock_cli.proc.process import Child
from tasklock_cli.proc.process import Terminal
from tasklock_cli.proc.process import become_subreaper
from tasklock_cli.run.announce import emit_acquired
from tasklock_cli.run.announce import emit_done_already
from tasklock_cli.run.announce import emit_guard_died
from tasklock_cli.run.announce import emit_killing_after_grace
from tasklock_cli.run.announce import emit_lost
from tasklock_cli.run.announce import emit_orphans_terminated
from tasklock_cli.run.announce import emit_refusal
from tasklock_cli.run.announce import emit_renewed
from tasklock_cli.run.announce import emit_replacing
from tasklock_cli.run.announce import emit_waiting
from tasklock_cli.run.announce import ledger_warning
from tasklock_cli.run.announce import ran_late
from tasklock_cli.run.environment import command_env
from tasklock_cli.run.environment import lease_env
from tasklock_cli.run.heartbeat import Heartbeat
from tasklock_cli.run.holding import Holding
from tasklock_cli.run.holding import Loss
from tasklock_cli.run.holding import keepers_of_run
from tasklock_cli.run.holding import loss_by_now
from tasklock_cli.run.holding import release_and_report
from tasklock_cli.run.holding import release_held
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.options import RunOptions
from tasklock_cli.run.waiter import Waiter
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util import clock as clocks
from tasklock_cli.util import signals as signal
from tasklock_cli.util import suppressed
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field
from tasklock_cli.util.records import replace

FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from tasklock_cli.run.hooks import Hooks

#: A signal that arrives during a store call (connecting, acquiring) lets the call finish
#: this long, so a lease it grants is known and released; a call still blocked (a store
#: cut off, a dead link) is then cut short.
CUT_SHORT_AFTER_S = 0.08
#: A lease granted before the signal goes back with this long for its release (the store
#: may be what kept us waiting): within the 200 ms the contract gives a signal to end us.
RELEASE_ON_SIGNAL_S = 0.12


@dataclass
class _State:
    loss: Loss | None = None
    kill_sent: bool = False
    term_forwarded_at: float | None = None
    orphans_terminated_at: float | None = None  # the command exited, leaving processes
    pending_signals: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        store: Store,
        options: RunOptions,
        events: EventLog,
        clock: clocks.Clock = clocks.monotonic,
        open_store: Callable[[], Store] | None = None,
        guard: Child | None = None,
    ) -> None:
        """``open_store`` opens a client of the store for each ``--also`` key. ``guard``:
        the command's guard, forked already (``fork_guard``); else the run forks it before
        its acquire. Either way the run owns it: cancelled if the command never starts."""
        self.store = store
        options = replace(options, failover_window=store.failover_window)
        self.options = options
        self.events = events
        self.clock = clock
        own_stores = [open_store() for _ in options.also] if open_store else []
        keepers = keepers_of_run([store, *own_stores], options, clock)
        self.keeper = keepers[0]
        self.state = _State()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.holding = Holding(keepers, self._heartbeat_of, own_stores)
        self.child: Child | None = None  # once the command started
        self._guard = guard  # forked before the acquire, the command not started
        self._on_ledger_failed = ledger_warning(events, self.keeper)
        self._waiter: Waiter | None = None
        self._acquiring = False
        self._loss_lock = _thread.allocate_lock()
        self.hooks = hooks_of(options, events)

    def _heartbeat_of(self, keeper: LeaseKeeper) -> Heartbeat:
        return Heartbeat(
            keeper,
            self.options,
            self.events,
            on_loss=lambda kind, detail, kill_at: self._lose(kind, detail, kill_at=kill_at),
            on_renewed=self._renewed,
            on_deadline=self._wake,
            clock=self.clock,
        )

    # -- the whole run ------------------------------------------------------------------

    def run(self) -> int:
        # Handlers from the start: a signal while waiting stops the wait, and one that
        # comes once the lease is held can no longer kill us before we release it.
        previous_handlers = install_signal_handlers(self._on_signal, self._on_alarm, self._wake_w)
        try:
            return self._acquire_and_run()
        except Interrupted as stop:  # before the command started
            self._stop_acquiring()
            self.events.debug(f"{stop} (while acquiring {self.options.key!r})")
            # A lease we were granted goes back, quickly: the store may be what kept us waiting.
            records = self.holding.records("signalled", None)
            self.holding.release_quietly(RELEASE_ON_SIGNAL_S, records, self._on_ledger_failed)
            return stop.exit_code
        finally:
            if self._guard is not None:  # the command never started
                self._guard.cancel()
            restore_signal_handlers(previous_handlers)
            self.holding.close()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)

    def _acquire_and_run(self) -> int:
        options = self.options
        self.holding.set_io_timeout(options.schedule.io_timeout)
        # The guard first: it sets itself up while the store is contacted, and the store
        # records it with the acquire (no second transaction before the command starts).
        self.holding.run_under(self._fork_guard().guard_pid)
        self._acquiring = True
        try:
            done_by = self._acquire()
        except NotGranted as refused:
            emit_refused(self.events, refused, self.hooks, options)
            return options.conflict_exit_code
        finally:
            self._stop_acquiring()
        for keeper in self.holding.in_order:
            emit_acquired(self.events, options, keeper)
        if done_by is not None and not self.state.pending_signals:  # this window's work is done
            emit_done_already(self.events, options.key, self.keeper.fencing_token, done_by)
            self._release_all("done-already", None)
            return options.done_exit_code
        return between_hooks(self)

    def _acquire(self) -> RunRecord | None:
        """Take the leases, in key order, holding those taken while waiting for the next.
        With --wait 0, a run that cannot have them all holds none. With --once-per, returns
        the run that already did this window's work: the leases are then held, but the
        command must not run. Else returns None."""
        options, io_timeout = self.options, self.options.schedule.io_timeout
        try:
            self.holding.take_all(options.wait, self._waiter_for)
            done_by = self.keeper.window_done_by(options.once_per, io_timeout)
            if done_by is None:
                # A long wait or a slow reply may have left little of a lease: renew first.
                self.holding.ensure_remaining(options.lease_window / 2, io_timeout)
        except TasklockError:
            self.holding.give_back(io_timeout)
            self._raise_if_signalled()  # it came during the last attempt: it wins
            raise
        return done_by

    def _waiter_for(self, keeper: LeaseKeeper, wait: float) -> Waiter:
        options = self.options

        def announce(info: LeaseInfo | None) -> None:
            emit_waiting(self.events, keeper.key, options.wait, info, keeper.store.holdup)

        self._waiter = Waiter(
            keeper,
            wait,
            on_waiting=announce,
            wake_fd=self._wake_r,
            supersede=options.supersede,
            replace=options.replace,
            on_broken=lambda broken: emit_replacing(self.events, keeper.key, broken),
            priority=options.priority,
            max_waiting=options.max_waiting,
        )
        self._raise_if_signalled()  # came before the waiter could hear of it
        return self._waiter

    def _fork_guard(self) -> Child:
        if self._guard is None:
            self._guard = fork_guard(self.options)
        return self._guard

    def _raise_if_signalled(self) -> None:
        if self.state.pending_signals:
            raise Interrupted(self.state.pending_signals[0]) from None

    def _stop_acquiring(self) -> None:
        self._acquiring = False
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _run_child(self) -> int:
        terminal = Terminal()
        child: Child | None = None
        try:
            if self.state.pending_signals:  # asked to stop before the child even started
                signum = self.state.pending_signals[0]
                self._release_all("signalled", None)
                return ExitCode.SIGNALLED + signum
            child = self._fork_guard()  # recorded with the leases (``run_under``)
            self._guard = None
            try:
                child.start(lease_env(self.keeper, self.holding), terminal.fd, self._backstop_in())
            except TasklockError as exc:
                self._release_all("failed", exc.exit_code)
                raise
            self.child = child
            for signum in self.state.pending_signals:  # came while it was being started
                self._forward(child, signum)
            self.state.pending_signals.clear()
            terminal.give_to(child.pgid)
            self.holding.start(child.guard_pid)
            self._watch(child, terminal)
            io_timeout = self.options.schedule.io_timeout
            self.holding.stop(join_within=io_timeout)
            try:
                return self._finish(child)
            finally:
                self.holding.join(io_timeout)
        finally:
            terminal.take_back()

    def _finish(self, child: Child) -> int:
        loss = self.state.loss
        records = {k.key: run_record_of(k, loss, child) for k in self.holding.in_order}
        keep_for = 0.0
        if loss is None and not child.guard_died:
            held_for = self.clock() - self.holding.acquired_at()
            keep_for = max(0.0, self.options.hold_at_least - held_for)
        release_held(self.holding, self.options, self.events, records, loss, keep_for)
        if loss is not None or child.guard_died:
            return ExitCode.LOST
        return child.exit_code()

    def _watch(self, child: Child, terminal: Terminal) -> None:
        options = self.options
        started = self.clock()
        while True:
            child.poll()
            if child.stopped_by is not None:
                terminal.suspend_with(child)
            self._note_guard_reports(child)
            if child.tree_empty:
                if child.orphans and self.state.orphans_terminated_at is not None:
                    emit_orphans_terminated(self.events, self.keeper, child.orphans)
                return
            now = self.clock()
            state = self.state
            if state.loss is None and child.exited and state.orphans_terminated_at is None:
                # Nothing the lock covered may run on unlocked: what the command left running
                # gets SIGTERM now, SIGKILL after --grace, and only then is the lease released.
                state.orphans_terminated_at = now
                child.terminate_orphans()
            if state.loss is None:
                loss = loss_by_now(options, now, self.holding.deadline(), started)
                if loss is not None:
                    self._lose(loss.detected_by, loss.detail, kill_at=loss.kill_at)
            self._enforce(child, now)
            self._sleep_until_next_event(child, now, started)

    def _note_guard_reports(self, child: Child) -> None:
        """The guard killed the tree at the deadline by itself (we were not running), the
        command exited past the deadline, or the guard itself died."""
        if self.state.loss is None and child.backstop_fired:
            self._lose(LossKind.RESUMED_LATE, "paused past the local lease deadline", kill_at=0.0)
        if self.state.loss is None and child.exited_at is not None:
            exited_on_our_clock = self.clock() - (clocks.monotonic() - child.exited_at)
            if exited_on_our_clock >= self.holding.deadline():
                late = exited_on_our_clock - self.holding.deadline()
                self._lose(LossKind.RESUMED_LATE, ran_late(late), kill_at=0.0)
        if child.guard_died:
            emit_guard_died(self.events, self.options.key)

    def _enforce(self, child: Child, now: float) -> None:
        state = self.state
        if state.loss is not None and not state.kill_sent and now >= self._kill_time():
            child.signal_tree(signal.SIGKILL)
            state.kill_sent = True
        for signalled_at in (state.term_forwarded_at, state.orphans_terminated_at):
            if signalled_at is None or state.kill_sent or now < signalled_at + self.options.grace:
                continue
            emit_killing_after_grace(self.events, self.options.grace)
            child.signal_tree(signal.SIGKILL)
            state.kill_sent = True

    def _backstop_in(self) -> float:
        """Seconds until the guard kills the tree by itself: after our own SIGKILL would
        have gone out, still before the local deadline (and so before the store's)."""
        return self.holding.deadline() - self.options.schedule.safety_margin / 2 - self.clock()

    def _kill_time(self) -> float:
        """When the SIGKILL goes out after a loss: as the loss planned it, but never past the
        local deadline, whatever else fails meanwhile (say max-lifetime, then the store)."""
        assert self.state.loss is not None
        return min(
            self.state.loss.kill_at, self.holding.deadline() - self.options.schedule.safety_margin
        )

    def _sleep_until_next_event(self, child: Child, now: float, started: float) -> None:
        options, state = self.options, self.state
        wake_times = [
            self.holding.deadline() - options.schedule.safety_margin - options.loss_grace,
            self.holding.deadline(),
            started + options.max_lifetime,
        ]
        if state.loss is not None and not state.kill_sent:
            wake_times.append(self._kill_time())
        for signalled_at in (state.term_forwarded_at, state.orphans_terminated_at):
            if signalled_at is not None and not state.kill_sent:
                wake_times.append(signalled_at + options.grace)
        timeout = min(max(min(wake_times) - now, 0.0), 1.0)
        with suppressed(InterruptedError):
            select.select([self._wake_r, *child.waitables()], [], [], timeout)
        with suppressed(BlockingIOError):
            while os.read(self._wake_r, 512):
                pass

    def _lose(self, detected_by: str, detail: str, kill_at: float) -> None:
        with self._loss_lock:
            if self.state.loss is not None:
                return
            self.state.loss = Loss(detected_by, detail, kill_at)
        child = self.child
        if child is not None and child.group_alive():  # the command, or what it left running
            if kill_at <= self.clock():
                child.signal_tree(signal.SIGKILL)
                self.state.kill_sent = True
            else:
                child.signal_tree(signal.SIGTERM)
                child.signal_tree(signal.SIGCONT)  # a stopped process must run to handle it
        emit_lost(self.events, self.keeper, detected_by, detail, "; terminating the command")
        self._wake()

    def _renewed(self, lease: Lease) -> None:
        if self.child is not None:
            self.child.set_backstop(self._backstop_in())
        emit_renewed(self.events, lease)

    # -- release, signals ---------------------------------------------------------

    def _release_all(self, outcome: str, exit_code: int | None) -> None:
        """Release every lease held, each recording the run (``outcome``) in its key's
        ledger."""
        for keeper in self.holding.held():
            record = keeper.run_record(outcome, exit_code)
            release_and_report(keeper, self.options, self.events, record=record)

    def _wake(self) -> None:
        with suppressed(BlockingIOError, OSError):
            os.write(self._wake_w, b"!")

    def _on_signal(self, signum: int, _frame: object) -> None:
        child = self.child
        if child is not None:
            self._forward(child, signum)
            return
        self.state.pending_signals.append(signum)
        if self._waiter is not None:
            self._waiter.interrupt(signum)  # raises Interrupted when blocked waiting
        if self._acquiring:  # in a store call: cut it short if it does not end soon
            signal.setitimer(signal.ITIMER_REAL, CUT_SHORT_AFTER_S)

    def _on_alarm(self, _signum: int, _frame: object) -> None:
        if self._acquiring and self.state.pending_signals:
            self._acquiring = False
            raise Interrupted(self.state.pending_signals[0])

    def _forward(self, child: Child, signum: int) -> None:
        child.signal_group(signum)
        if signum == signal.SIGTERM and self.state.term_forwarded_at is None:
            self.state.term_forwarded_at = self.clock()


def fork_guard(options: RunOptions) -> Child:
    """The command's guard, forked now (``Child``), this process its subreaper first: if
    the guard dies, what it leaves running comes to us."""
    become_subreaper()
    return Child(options.command, command_env(options))


def install_signal_handlers(on_signal, on_alarm, wake_fd: int) -> dict:
    """Our handlers for the run, and the wake-up fd for every signal; what they replaced."""
    previous: dict = {}
    for signum in FORWARDED_SIGNALS:
        previous[signum] = signal.signal(signum, on_signal)
    previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
    previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, lambda *_: None)
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, on_alarm)
    previous["wakeup"] = signal.set_wakeup_fd(wake_fd)
    return previous


def restore_signal_handlers(previous: dict) -> None:
    signal.set_wakeup_fd(previous.pop("wakeup"))
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def hooks_of(options: RunOptions, events: EventLog) -> Hooks | None:
    """The run's hooks; None without any (run.hooks is imported only for one)."""
    if not options.hooks:
        return None
    from tasklock_cli.run.hooks import Hooks

    return Hooks(options, events)


def between_hooks(supervisor: Supervisor) -> int:
    """The command's run, between its hooks when it has any (``Hooks.around_command``)."""
    hooks, options = supervisor.hooks, supervisor.options
    if hooks is None:
        return supervisor._run_child()
    env = {**command_env(options), **lease_env(supervisor.keeper, supervisor.holding)}

    def ended() -> tuple[bool, int | None]:
        return how_it_ended(lambda: supervisor.child, supervisor.state)

    return hooks.around_command(env, supervisor.holding, supervisor._run_child, ended)


def how_it_ended(child_of: Callable[[], Child | None], state: _State) -> tuple[bool, int | None]:
    """Whether the lease was lost, and the command's exit code (None: it did not run)."""
    child, lost = child_of(), state.loss is not None
    if child is None or child.status is None:
        return lost, None
    return lost or child.guard_died, child.exit_code()


def emit_refused(
    events: EventLog,
    refused: NotGranted,
    hooks: Hooks | None,
    options: RunOptions,
) -> None:
    """The lock was not acquired: its event (``announce.emit_refusal``), then the
    ``on-conflict`` hook."""
    emit_refusal(events, refused)
    if hooks is not None:
        hooks.conflict(command_env(options))


def run_record_of(keeper: LeaseKeeper, loss: Loss | None, child: Child) -> RunRecord | None:
    """The run ledger's record of how the command's run ended."""
    if loss is not None:
        return keeper.run_record("lost", None, loss.detected_by)
    if child.guard_died:
        return keeper.run_record("lost", None, "guard-died")
    code = child.exit_code()
    if child.status is not None and os.WIFSIGNALED(child.status):
        return keeper.run_record("signalled", code)
    return keeper.run_record("succeeded" if code == 0 else "failed", code)
