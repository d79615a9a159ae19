"""`tasklock run`: hold a lease for exactly as long as a command runs, and never longer.

The main thread watches the child and the clock; a heartbeat thread renews the lease.
Whatever goes wrong with renewals, the child's process group is dead before the local
deadline, which is itself earlier than the store's expiry.
"""

from __future__ import annotations

import contextlib
import getpass
import math
import os
import select
import signal
import socket
import threading
from dataclasses import dataclass, field

from tasklock_cli import clock as clocks
from tasklock_cli.durations import format_duration
from tasklock_cli.errors import Interrupted, LeaseLost, StoreUnavailable, TasklockError
from tasklock_cli.events import EventLog
from tasklock_cli.lease import Conflict, LeaseKeeper, Waiter, describe_holder
from tasklock_cli.process import Child, Terminal, become_subreaper
from tasklock_cli.stores.base import Holder, LeaseInfo, RunRecord, Store, rfc3339

FORWARDED_SIGNALS = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
JOB_CONTROL_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
#: A signal that arrives during a store call (connecting, acquiring) lets the call finish
#: this long, so a lease it grants is known and released; a call still blocked (a store
#: cut off, a dead link) is then cut short.
CUT_SHORT_AFTER_S = 0.12
#: A lease broken by an operator: the command gets at most this long between SIGTERM and
#: SIGKILL, so that `release --force` (which waits 10 s) sees the holder let go.
BROKEN_GRACE_CAP_S = 8.0
LOST_EXIT_CODE = 70
#: Releases tried with the run's record before the record is given up (see _release).
LEDGER_TRIES = 2


@dataclass(frozen=True)
class RunOptions:
    key: str
    command: list[str]
    ttl: float = 30.0
    renew_every: float | None = None
    wait: float = 0.0
    grace: float = 5.0
    max_lifetime: float = 86400.0
    hold_at_least: float = 0.0
    conflict_exit_code: int = 75
    note: str | None = None
    store_url: str | None = None  # passed to the command (TASKLOCK_STORE) for `check`

    @property
    def safety_margin(self) -> float:
        """Kept between the child's SIGKILL and the local deadline."""
        return min(1.0, max(0.05, self.ttl * 0.05))

    @property
    def renew_interval(self) -> float:
        """--renew-every (ttl/3 by default), but never so close to the ttl that the first
        renewal would come after the child had to be stopped."""
        wanted = self.renew_every if self.renew_every is not None else self.ttl / 3
        return min(wanted, (self.ttl - self.safety_margin) * 0.75)

    @property
    def loss_grace(self) -> float:
        """The SIGTERM-to-SIGKILL window when renewals fail: --grace, shortened where the ttl
        is too short for it, so that retrying renewals still gets half the time left."""
        room = self.ttl - self.safety_margin - self.renew_interval
        return max(0.0, min(self.grace, room / 2))

    @property
    def renew_retry_interval(self) -> float:
        return max(0.05, min(1.0, self.renew_interval / 4))

    @property
    def io_timeout(self) -> float:
        return max(0.25, min(5.0, self.renew_interval / 2))


@dataclass
class Loss:
    detected_by: str
    detail: str
    kill_at: float  # clock time of the SIGKILL


@dataclass
class _State:
    loss: Loss | None = None
    kill_sent: bool = False
    term_forwarded_at: float | None = None
    orphans_terminated_at: float | None = None  # the command exited, leaving processes
    pending_signals: list[int] = field(default_factory=list)


def current_holder(command: list[str], note: str | None) -> Holder:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Holder(host=socket.gethostname(), pid=os.getpid(), user=user, command=command, note=note)


class Supervisor:
    def __init__(
        self,
        store: Store,
        options: RunOptions,
        events: EventLog,
        clock: clocks.Clock = clocks.monotonic,
    ) -> None:
        self.store = store
        self.options = options
        self.events = events
        self.clock = clock
        self.keeper = LeaseKeeper(
            store, options.key, options.ttl, current_holder(options.command, options.note), clock
        )
        self.state = _State()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._heartbeat_stop = threading.Event()
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.child: Child | None = None
        self._waiter: Waiter | None = None
        self._acquiring = False
        self._loss_lock = threading.Lock()

    # -- the whole run ------------------------------------------------------------------

    def run(self) -> int:
        # Handlers from the start: a signal while waiting stops the wait, and one that
        # comes once the lease is held can no longer kill us before we release it.
        previous_handlers = self._install_signal_handlers()
        try:
            return self._acquire_and_run()
        except Interrupted as stop:  # before the command started
            self._stop_acquiring()
            self.events.debug(f"{stop} (while acquiring {self.options.key!r})")
            self._let_go_in_haste()
            return stop.exit_code
        finally:
            self._restore_signal_handlers(previous_handlers)
            for fd in (self._wake_r, self._wake_w, self._stop_r, self._stop_w):
                os.close(fd)

    def _acquire_and_run(self) -> int:
        options = self.options
        self.store.set_io_timeout(options.io_timeout)
        self._acquiring = True
        try:
            self._acquire()
        except Conflict as conflict:
            self._emit_conflict(conflict)
            return options.conflict_exit_code
        finally:
            self._stop_acquiring()
        self._emit(
            "acquired",
            f"acquired {options.key!r} (fencing token "
            f"{self.keeper.fencing_token}, ttl {format_duration(options.ttl)})",
            expires_at=rfc3339(self.keeper.lease.expires_at),
        )
        return self._run_child()

    def _acquire(self) -> None:
        def announce(info: LeaseInfo | None) -> None:
            held_by = f" held by {describe_holder(info)}" if info else ""
            self._emit(
                "waiting",
                f"waiting for {self.options.key!r}{held_by}",
                wait=self.options.wait if math.isfinite(self.options.wait) else "inf",
                holder=info.holder.to_dict() if info else None,
            )

        self._waiter = Waiter(
            self.keeper, self.options.wait, on_waiting=announce, wake_fd=self._wake_r
        )
        if self.state.pending_signals:  # came before the waiter could hear of it
            raise Interrupted(self.state.pending_signals[0])
        try:
            self._waiter.acquire()
        except TasklockError:
            self._raise_if_signalled()  # it came during the last attempt: it wins
            raise
        # Right before starting the child, make sure enough of the lease is left (a long
        # wait, a slow reply); renew first otherwise.
        if self.keeper.remaining() < self.options.ttl / 2:
            try:
                self.keeper.renew()
            except TasklockError:
                with contextlib.suppress(TasklockError):  # one try: it may still be ours
                    self.keeper.release(lock_timeout=self.options.io_timeout)
                self._raise_if_signalled()
                raise

    def _raise_if_signalled(self) -> None:
        if self.state.pending_signals:
            raise Interrupted(self.state.pending_signals[0]) from None

    def _stop_acquiring(self) -> None:
        self._acquiring = False
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _let_go_in_haste(self) -> None:
        """Stopped by a signal before the command started: release a lease we were granted,
        giving the store little time (it may be the store that kept us waiting)."""
        if self.keeper.lease is None:
            return
        self.store.set_io_timeout(CUT_SHORT_AFTER_S)
        with contextlib.suppress(TasklockError):
            self.keeper.release(lock_timeout=CUT_SHORT_AFTER_S)

    def _run_child(self) -> int:
        terminal = Terminal()
        child: Child | None = None
        try:
            if self.state.pending_signals:  # asked to stop before the child even started
                signum = self.state.pending_signals[0]
                self._release(record=self.keeper.run_record("signalled", None))
                return 128 + signum
            become_subreaper()
            try:
                child = Child(self.options.command, self._child_env(), terminal.fd)
            except TasklockError as exc:
                self._release(record=self.keeper.run_record("failed", exc.exit_code))
                raise
            self.child = child
            child.set_backstop(self._backstop_in())
            for signum in self.state.pending_signals:  # came while it was being started
                self._forward(child, signum)
            self.state.pending_signals.clear()
            terminal.give_to(child.pgid)
            heartbeat = threading.Thread(
                target=self._heartbeat, name="tasklock-heartbeat", daemon=True
            )
            heartbeat.start()
            self._watch(child, terminal)
            self._stop_heartbeat()
            heartbeat.join(timeout=self.options.io_timeout)
            return self._finish(child)
        finally:
            terminal.take_back()

    def _finish(self, child: Child) -> int:
        loss = self.state.loss
        record = self._run_record(child)
        if loss is not None and loss.detected_by == "rejected":
            # Broken by an operator: it is still ours to let go, token-checked, unless
            # someone else holds it by now (then this frees nothing).
            self._release_once(record)
            return LOST_EXIT_CODE
        keep_for = 0.0
        if loss is None and not child.guard_died:
            keep_for = max(
                0.0, self.options.hold_at_least - (self.clock() - self.keeper.acquired_at)
            )
        self._release(keep_for, record)
        if loss is not None or child.guard_died:
            return LOST_EXIT_CODE
        return child.exit_code()

    def _run_record(self, child: Child) -> RunRecord | None:
        """The run ledger's record of how the command's run ended."""
        loss = self.state.loss
        if loss is not None:
            return self.keeper.run_record("lost", None, loss.detected_by)
        if child.guard_died:
            return self.keeper.run_record("lost", None, "guard-died")
        code = child.exit_code()
        if child.status is not None and os.WIFSIGNALED(child.status):
            return self.keeper.run_record("signalled", code)
        return self.keeper.run_record("succeeded" if code == 0 else "failed", code)

    # -- watching the child and the clock -------------------------------------------------

    def _watch(self, child: Child, terminal: Terminal) -> None:
        options = self.options
        started = self.clock()
        while True:
            child.poll()
            if child.stopped_by is not None:
                self._suspend_with(child, terminal)
            self._note_guard_reports(child)
            if child.tree_empty:
                self._report_orphans()
                return
            now = self.clock()
            state = self.state
            deadline = self.keeper.deadline
            if state.loss is None and child.exited and state.orphans_terminated_at is None:
                self._terminate_orphans(child, now)
            if state.loss is None:
                if now >= deadline:
                    # Past the deadline without having started to terminate: this process
                    # was not running (SIGSTOP, VM freeze) while its lease ran out.
                    self._lose(
                        "resumed-late",
                        f"resumed {format_duration(now - deadline)} past the local lease deadline",
                        kill_at=now,
                    )
                elif now >= deadline - options.safety_margin - options.loss_grace:
                    self._lose(
                        "unreachable",
                        "could not renew the lease in time",
                        kill_at=deadline - options.safety_margin,
                    )
                elif now - started >= options.max_lifetime:
                    self._lose(
                        "max-lifetime",
                        f"reached --max-lifetime {format_duration(options.max_lifetime)}",
                        kill_at=now + options.grace,
                    )
            self._enforce(child, now)
            self._sleep_until_next_event(child, now, started)

    def _note_guard_reports(self, child: Child) -> None:
        """The guard killed the tree at the deadline by itself (we were not running), the
        command exited past the deadline, or the guard itself died."""
        if self.state.loss is None and child.backstop_fired:
            self._lose("resumed-late", "paused past the local lease deadline", kill_at=0.0)
        if self.state.loss is None and child.exited_at is not None:
            exited_on_our_clock = self.clock() - (clocks.monotonic() - child.exited_at)
            if exited_on_our_clock >= self.keeper.deadline:
                late = exited_on_our_clock - self.keeper.deadline
                detail = f"the command ran {format_duration(late)} past the local lease deadline"
                self._lose("resumed-late", detail, kill_at=0.0)
        if child.guard_died:
            self.events.error(
                f"the guard of the command on {self.options.key!r} died; "
                "the command's process tree was killed"
            )

    def _terminate_orphans(self, child: Child, now: float) -> None:
        """The command exited, leaving processes running: nothing the lock covered may run
        on unlocked, so they get SIGTERM now and SIGKILL after --grace, then we release."""
        self.state.orphans_terminated_at = now
        if child.orphans:
            child.signal_tree(signal.SIGTERM)
            child.signal_tree(signal.SIGCONT)

    def _report_orphans(self) -> None:
        child = self.child
        if child is None or not child.orphans or self.state.orphans_terminated_at is None:
            return
        count = child.orphans
        self._emit(
            "orphans-terminated",
            f"terminated {count} process{'' if count == 1 else 'es'} the command left running",
            count=count,
        )

    def _enforce(self, child: Child, now: float) -> None:
        state = self.state
        if state.loss is not None and not state.kill_sent and now >= self._kill_time():
            child.signal_tree(signal.SIGKILL)
            state.kill_sent = True
        for signalled_at in (state.term_forwarded_at, state.orphans_terminated_at):
            if signalled_at is None or state.kill_sent or now < signalled_at + self.options.grace:
                continue
            self.events.debug(
                f"ignored SIGTERM for {format_duration(self.options.grace)}; sending SIGKILL"
            )
            child.signal_tree(signal.SIGKILL)
            state.kill_sent = True

    def _backstop_in(self) -> float:
        """Seconds until the guard kills the tree by itself: after our own SIGKILL would
        have gone out, still before the local deadline (and so before the store's)."""
        return self.keeper.deadline - self.options.safety_margin / 2 - self.clock()

    def _kill_time(self) -> float:
        """When the SIGKILL goes out after a loss: as the loss planned it, but never past the
        local deadline, whatever else fails meanwhile (say max-lifetime, then the store)."""
        assert self.state.loss is not None
        return min(self.state.loss.kill_at, self.keeper.deadline - self.options.safety_margin)

    def _sleep_until_next_event(self, child: Child, now: float, started: float) -> None:
        options, state = self.options, self.state
        wake_times = [
            self.keeper.deadline - options.safety_margin - options.loss_grace,
            self.keeper.deadline,
            started + options.max_lifetime,
        ]
        if state.loss is not None and not state.kill_sent:
            wake_times.append(self._kill_time())
        for signalled_at in (state.term_forwarded_at, state.orphans_terminated_at):
            if signalled_at is not None and not state.kill_sent:
                wake_times.append(signalled_at + options.grace)
        timeout = min(max(min(wake_times) - now, 0.0), 1.0)
        with contextlib.suppress(InterruptedError):
            select.select([self._wake_r, child], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
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
        self._emit(
            "lost",
            f"lost the lease on {self.options.key!r} ({detected_by}: {detail}); "
            "terminating the command",
            detected_by=detected_by,
            detail=detail,
        )
        self._wake()

    def _suspend_with(self, child: Child, terminal: Terminal) -> None:
        """The child was stopped by job control (Ctrl-Z): stop ourselves too, like a shell
        job, and continue it when we are continued. The lease keeps running meanwhile."""
        signum = child.stopped_by
        child.stopped_by = None
        if not terminal.handed_over or signum not in JOB_CONTROL_STOPS:
            return
        terminal.take_back()
        # Stop like a shell job; in an orphaned group the kernel drops SIGTSTP and we go on.
        os.kill(os.getpid(), signal.SIGTSTP)
        terminal.give_to(child.pgid)
        child.signal_group(signal.SIGCONT)

    # -- heartbeat --------------------------------------------------------------------

    def _heartbeat(self) -> None:
        options = self.options
        next_renewal = self.keeper.acquired_at + options.renew_interval
        while not self._until_renewal(next_renewal):
            if self.state.loss is not None and self.state.loss.detected_by == "rejected":
                return
            if self.clock() >= self.keeper.deadline:
                self._wake()  # the watcher decides: we were paused, or could not renew
                return
            try:
                lease = self.keeper.renew()
            except LeaseLost as exc:
                grace = min(options.grace, BROKEN_GRACE_CAP_S)
                self._lose("rejected", str(exc), kill_at=self.clock() + grace)
                return
            except StoreUnavailable as exc:
                self.events.debug(f"renewal failed, retrying: {exc}")
                next_renewal = self.clock() + options.renew_retry_interval
                continue
            except Exception as exc:  # a heartbeat that dies silently would let the child run on
                self._lose(
                    "unreachable",
                    f"renewal failed: {exc!r}",
                    kill_at=self.keeper.deadline - options.safety_margin,
                )
                return
            if self.child is not None:
                self.child.set_backstop(self._backstop_in())
            self._emit(
                "renewed",
                f"renewed {options.key!r} until {rfc3339(lease.expires_at)}",
                expires_at=rfc3339(lease.expires_at),
            )
            next_renewal = self.clock() + options.renew_interval

    def _until_renewal(self, renew_at: float) -> bool:
        """Wait until ``renew_at``, or less when the store tells us our lease was broken
        (the renewal that follows at once is rejected); True when the heartbeat must stop."""
        while not self._heartbeat_stop.is_set():
            left = renew_at - self.clock()
            lease = self.keeper.lease
            if left <= 0 or lease is None:
                return False
            started = self.clock()
            try:
                if self.store.wait_for_break(lease, left, self._stop_r):
                    self.events.debug(f"{self.options.key!r} was broken: renewing at once")
                    return self._heartbeat_stop.is_set()
            except Exception as exc:  # no notifications, then: sleep, renewals still tell
                self.events.debug(f"cannot listen for a break of {self.options.key!r}: {exc}")
                return self._heartbeat_stop.wait(max(0.0, renew_at - self.clock()))
            if self.clock() - started < min(left, 0.001):  # returned at once: do not spin
                return self._heartbeat_stop.wait(max(0.0, renew_at - self.clock()))
        return True

    def _stop_heartbeat(self) -> None:
        self._heartbeat_stop.set()
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._stop_w, b"!")

    # -- release, events, signals ---------------------------------------------------------

    def _release_once(self, record: RunRecord | None = None) -> None:
        try:
            released = self.keeper.release(lock_timeout=self.options.io_timeout, record=record)
        except StoreUnavailable:
            return
        except TasklockError as exc:
            if record is None:
                return
            self._ledger_failed(exc)
            self._release_once()
            return
        if released:
            self._emit("released", f"released {self.options.key!r}")

    def _ledger_failed(self, exc: TasklockError) -> None:
        """Writing the run's record failed (and with it that release): the release is
        retried without it, and the command's exit code stands."""
        self.events.warning(
            f"could not write the run of {self.options.key!r} to the run ledger ({exc}); "
            "releasing without it",
            key=self.options.key,
            fencing_token=self.keeper.fencing_token,
        )

    def _release(self, keep_for: float = 0.0, record: RunRecord | None = None) -> None:
        """Release, retrying while the lease could still be ours; never claim a false release.
        A release whose run record cannot be written is retried without the record: at
        once when the store refused it, after a second failure when the store's answer
        does not tell a ledger problem from an outage."""
        key = self.options.key
        token = self.keeper.fencing_token
        failures = 0
        while True:
            try:
                released = self.keeper.release(
                    keep_for, lock_timeout=self.options.io_timeout, record=record
                )
            except StoreUnavailable as exc:
                failures += 1
                if record is not None and failures >= LEDGER_TRIES:
                    self._ledger_failed(exc)
                    record = None
                    continue
                if self.keeper.remaining() > self.options.io_timeout:
                    self.events.debug(f"release failed, retrying: {exc}")
                    self._heartbeat_stop.wait(self.options.renew_retry_interval)
                    continue
                self.events.error(
                    f"could not release {key!r} ({exc}); it expires on its own "
                    f"within {format_duration(max(0.0, self.keeper.remaining()))}"
                )
                return
            except TasklockError as exc:
                if record is None:
                    raise
                self._ledger_failed(exc)
                record = None
                continue
            break
        if not released:
            self.events.debug(f"{key!r} was no longer held by us at release")
            return
        held = f", held for {format_duration(keep_for)} more (--hold-at-least)" if keep_for else ""
        self._emit("released", f"released {key!r}{held}", fencing_token=token, kept_for=keep_for)

    def _emit(
        self, event: str, message: str, fencing_token: int | None = None, **fields: object
    ) -> None:
        token = fencing_token if fencing_token is not None else self.keeper.fencing_token
        self.events.emit(event, self.options.key, token, message, **fields)

    def _emit_conflict(self, conflict: Conflict) -> None:
        info = conflict.holder
        self.events.emit(
            "conflict",
            self.options.key,
            info.fencing_token if info else None,
            f"{conflict}; not running the command",
            holder=info.holder.to_dict() if info else None,
            expires_at=rfc3339(info.expires_at) if info else None,
        )

    def _child_env(self) -> dict[str, str]:
        lease = self.keeper.lease
        env = dict(os.environ)
        env["TASKLOCK_KEY"] = self.options.key
        env["TASKLOCK_FENCING_TOKEN"] = str(lease.fencing_token)
        env["TASKLOCK_LEASE_EXPIRES_AT"] = rfc3339(lease.expires_at)
        env["TASKLOCK_SLOT"] = "0"
        if self.options.store_url is not None:
            env["TASKLOCK_STORE"] = self.options.store_url
        return env

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
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

    def _install_signal_handlers(self) -> dict[int, object]:
        previous: dict[int, object] = {}
        for signum in FORWARDED_SIGNALS:
            previous[signum] = signal.signal(signum, self._on_signal)
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, lambda *_: None)
        previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._on_alarm)
        previous["wakeup"] = signal.set_wakeup_fd(self._wake_w)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, object]) -> None:
        signal.set_wakeup_fd(previous.pop("wakeup"))
        for signum, handler in previous.items():
            signal.signal(signum, handler)
