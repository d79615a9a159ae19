"""The command: started by a guard process (see guard.py), signalled as a group or as a tree."""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost ~2 ms per start
import os
import sys

from tasklock_cli.errors import CommandNotExecutable
from tasklock_cli.errors import CommandNotFound
from tasklock_cli.errors import ExitCode
from tasklock_cli.errors import TasklockError
from tasklock_cli.proc import proctree
from tasklock_cli.proc.guard import GUARD_SIGNALS
from tasklock_cli.proc.guard import become_subreaper
from tasklock_cli.proc.guard import run_guard
from tasklock_cli.proc.protocol import ENV_ORDER
from tasklock_cli.proc.protocol import MESSAGE_SIZE
from tasklock_cli.proc.protocol import ORDER_BACKSTOP
from tasklock_cli.proc.protocol import ORDER_GROUP
from tasklock_cli.proc.protocol import ORDER_TREE
from tasklock_cli.proc.protocol import REPORT_BACKSTOP
from tasklock_cli.proc.protocol import REPORT_EMPTY
from tasklock_cli.proc.protocol import REPORT_ERROR
from tasklock_cli.proc.protocol import REPORT_EXITED
from tasklock_cli.proc.protocol import REPORT_STARTED
from tasklock_cli.proc.protocol import REPORT_STOPPED
from tasklock_cli.proc.protocol import START_ORDER
from tasklock_cli.proc.protocol import decode
from tasklock_cli.proc.protocol import encode
from tasklock_cli.proc.protocol import environ_pieces
from tasklock_cli.proc.protocol import receive
from tasklock_cli.util import clock as clocks
from tasklock_cli.util import signals as signal
from tasklock_cli.util import suppressed
from tasklock_cli.util.durations import INFINITY
from tasklock_cli.util.fds import fd_readable
from tasklock_cli.util.sanitize import recordable

__all__ = ["Child", "Terminal", "become_subreaper", "spawn_command"]

JOB_CONTROL_STOPS = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
#: After the guard died, how long the wrapper keeps killing what it left (they are ours now).
TAKE_OVER_S = 2.0
#: Once the command has exited, its guard (woken by the same exit) reports within a fraction
#: of this.
#: The wrapper spins for the report, yielding the CPU, instead of sleeping again.
#: Being woken costs 0.2-0.4 ms on a virtual machine, and the release waits on it.
#: Measured interleaved on etcd: hand-off p50 7.59 ms against 8.10 without (1 waiter).
REPORT_SPIN_S = 0.001


def spawn_command(
    command: list[str],
    env: dict[str, str] | dict[bytes, bytes],
    terminal_fd: int | None = None,
    listed_fds: list[int] | None = None,
) -> int:
    """Start ``command`` in its own process group with exactly ``env``; its pid.

    As ``subprocess.Popen(command, env=env, close_fds=True, process_group=0)`` would start it:
    with ``os.posix_spawnp``, which needs no import (subprocess costs ~4 ms of every start),
    when that is the same (see ``_spawns_alike``); else through subprocess itself.
    ``listed_fds``: our inheritable descriptors, listed beforehand (``_inheritable_fds``);
    else they are listed now."""
    if not command[0]:  # (posix_spawnp refuses it with a ValueError; a shell says 127)
        raise CommandNotFound("command not found: ''")
    named = recordable(command[0])  # (a byte that is not UTF-8 as \xff, as the store keeps it)
    try:
        if _spawns_alike(env, terminal_fd):
            inherited = _inheritable_fds() if listed_fds is None else listed_fds
            if inherited is not None:
                return _posix_spawn(command, env, inherited)
        return _popen(command, env, terminal_fd)
    except FileNotFoundError:
        raise CommandNotFound(f"command not found: {named}") from None
    except (PermissionError, IsADirectoryError):
        raise CommandNotExecutable(f"command not executable: {named}") from None
    except OSError as exc:
        raise CommandNotExecutable(f"cannot run {named}: {exc.strerror}") from None
    except ValueError as exc:  # what exec cannot take (a NUL byte): the guard reports it
        raise CommandNotExecutable(f"cannot run {named}: {exc}") from None


def _spawns_alike(env: dict[str, str] | dict[bytes, bytes], terminal_fd: int | None) -> bool:
    """Whether ``posix_spawnp`` starts the command as Popen would: no terminal to take in the
    child before exec (that needs code run there), and the command found on the same PATH
    (posix_spawnp searches ours, Popen the command's; the run passes ours on)."""
    if terminal_fd is not None:
        return False
    theirs = [os.fsencode(value) for name, value in env.items() if os.fsencode(name) == b"PATH"]
    return theirs == [os.environb[b"PATH"]] if b"PATH" in os.environb else not theirs


def _inheritable_fds() -> list[int] | None:
    """Our descriptors above stderr that an exec would pass on (Popen's close_fds closes
    them in the child); None when /proc cannot say."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    inheritable = []
    for fd in map(int, names):
        with suppressed(OSError):  # the listing's own descriptor, closed by now
            if fd > 2 and os.get_inheritable(fd):
                inheritable.append(fd)
    return inheritable


def _posix_spawn(
    command: list[str], env: dict[str, str] | dict[bytes, bytes], close: list[int]
) -> int:
    """posix_spawnp in a group of its own, ``close`` closed, and the signals Python ignores
    at start (SIGPIPE, SIGXFSZ) back to their defaults, as Popen's restore_signals does."""
    return os.posix_spawnp(
        command[0],
        command,
        env,
        file_actions=[(os.POSIX_SPAWN_CLOSE, fd) for fd in close],
        setpgroup=0,
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
    )


def _popen(
    command: list[str], env: dict[str, str] | dict[bytes, bytes], terminal_fd: int | None
) -> int:
    """Popen, for what posix_spawnp cannot do alike; imported here, off the usual path."""
    import subprocess

    if terminal_fd is not None:
        # Take the terminal in the child itself, before exec: otherwise a command that
        # reads at once can meet the terminal still ours, and be stopped by SIGTTIN.
        group: dict = {"preexec_fn": lambda: _foreground_own_group(terminal_fd)}
    elif sys.version_info >= (3, 11):
        group = {"process_group": 0}
    else:
        group = {"preexec_fn": os.setpgrp}
    process = subprocess.Popen(command, env=env, close_fds=True, **group)
    process.returncode = 0  # the guard reaps it itself: Popen must never wait for it
    return process.pid


class Child:
    """The command and its whole process tree, as reported by its guard.

    Made in two steps, so that a run has its guard ready before the lock is its own (it
    forks it before the acquire): ``Child(command, env)`` forks the guard, which sets itself
    up and waits; ``start`` hands it the rest of the command's environment and has it start
    the command. ``poll`` reads the guard's reports; ``fileno`` is readable when one is
    waiting.
    """

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        """Fork the guard. ``env``: the part of the command's environment known already,
        which the guard has from the fork: nothing of it is sent (``start`` adds the rest)."""
        ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        # Our handlers must not run in the guard before it has set its own.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, GUARD_SIGNALS)
        try:
            guard_pid = os.fork()
            if guard_pid == 0:
                ours.close()
                # Listed now, while the lock is still being taken, not after the start order:
                # the guard opens nothing inheritable (its pipe and socket are close-on-exec).
                listed = _inheritable_fds()
                run_guard(theirs, lambda e, f: spawn_command(command, e, f, listed), blocked, env)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        theirs.close()
        self.guard_pid = guard_pid
        self._sock = ours
        self.pid = self.pgid = 0  # the command's, once started
        self._exit_fd: int | None = None  # a pidfd of the command, until it has exited
        self.status: int | None = None  # the raw wait status once the command has exited
        self.exited_at: float | None = None  # when, on clock.monotonic
        self.orphans = 0  # processes it left running when it exited
        self.stopped_by: int | None = None
        self.tree_empty = False
        self.backstop_fired = False  # the guard killed the tree at the deadline by itself
        self.guard_died = False

    def start(
        self, env: dict[str, str], terminal_fd: int | None = None, backstop_in: float = INFINITY
    ) -> None:
        """Have the guard start the command with the environment it was forked with and
        ``env`` over it (exactly that: nothing else); returns once the command runs. The guard kills
        the tree by itself ``backstop_in`` seconds from now (see ``set_backstop``), a
        deadline it has before the command starts."""
        pieces = environ_pieces(env)
        terminal = -1 if terminal_fd is None else terminal_fd
        backstop_at = clocks.monotonic() + max(0.0, backstop_in)
        start = START_ORDER + f"{terminal} {backstop_at!r} ".encode()
        with suppressed(OSError):  # the guard is gone: _started says so
            for piece in pieces[:-1]:
                self._sock.send(ENV_ORDER + piece)
            self._sock.send(start + pieces[-1])  # one wake-up of the guard when it fits
        self.pid = self.pgid = self._started()
        self._exit_fd = _pidfd(self.pid)

    def cancel(self) -> None:
        """Do without the command: end the guard, which has started nothing."""
        self._sock.close()
        with suppressed(ProcessLookupError):
            os.kill(self.guard_pid, signal.SIGKILL)
        with suppressed(ChildProcessError):
            os.waitpid(self.guard_pid, 0)

    def _started(self) -> int:
        while True:
            try:
                reply = decode(self._sock.recv(MESSAGE_SIZE))
                break
            except InterruptedError:  # pragma: no cover - PEP 475 retries for us
                continue
        verb, _, rest = reply.partition(" ")
        if verb == REPORT_STARTED:
            return int(rest)
        self._collect_guard()
        if verb == REPORT_ERROR:
            code, _, message = rest.partition(" ")
            if int(code) == CommandNotFound.exit_code:
                raise CommandNotFound(message)
            raise CommandNotExecutable(message)
        raise TasklockError(f"could not start the command under its guard ({reply or 'no reply'})")

    def fileno(self) -> int:
        return self._sock.fileno()

    def waitables(self) -> list[int]:
        """What the wrapper waits on for news of the command: the guard's reports, and
        until the command exits, its pidfd. That wakes the wrapper as the command exits,
        beside the guard instead of after it: by the time the wrapper runs, the guard's
        report is there or about to be (a wake-up saved when it matters, at a hand-off)."""
        if self._exit_fd is None:
            return [self._sock.fileno()]
        return [self._sock.fileno(), self._exit_fd]

    @property
    def exited(self) -> bool:
        return self.status is not None

    def exit_code(self) -> int:
        """The child's code, or 128+N when it was killed by signal N."""
        assert self.status is not None
        if os.WIFSIGNALED(self.status):
            return ExitCode.SIGNALLED + os.WTERMSIG(self.status)
        return os.WEXITSTATUS(self.status)

    def group_alive(self) -> bool:
        """True while any process of the tree remains (the command included)."""
        return not self.tree_empty

    def signal_group(self, signum: int) -> None:
        """Signal the command's process group (what a terminal would signal)."""
        self._order(ORDER_GROUP, signum)

    def signal_tree(self, signum: int) -> None:
        """Signal every process of the tree; SIGTERM and SIGKILL also reach processes that
        start later, until the tree is empty."""
        self._order(ORDER_TREE, signum)

    def terminate_orphans(self) -> None:
        """SIGTERM to what the command left running, if anything (SIGKILL is the caller's)."""
        if self.orphans:
            self.signal_tree(signal.SIGTERM)
            self.signal_tree(signal.SIGCONT)

    def set_backstop(self, seconds: float) -> None:
        """The guard kills the tree by itself ``seconds`` from now unless told a later time.
        Sent as a time on the shared boot clock, so a guard that reads it late (a loaded
        machine) does not kill late."""
        self._order(ORDER_BACKSTOP, repr(clocks.monotonic() + max(0.0, seconds)))

    def poll(self) -> None:
        """Read every report the guard has sent (never blocks but for a spin of at most
        ``REPORT_SPIN_S`` when a report is due at once: see ``_await_report``)."""
        if self._exit_fd is not None and fd_readable(self._exit_fd):
            self._close_exit_fd()  # it has exited: the guard's reports tell the rest
            self._await_report(REPORT_SPIN_S)
        empty_due = False
        while not self.tree_empty:
            report = receive(self._sock)
            if report is None and not empty_due and self.exited and not self.orphans:
                # The command left nothing running: the guard's "empty" follows its
                # "exited" at once (its next reap finds no child). Waiting for it here
                # rather than in the caller's next sleep saves a wake-up before the release.
                empty_due = True
                self._await_report(REPORT_SPIN_S)
                continue
            if report is None:
                return
            if not report:
                self._take_over()
                break
            self._note(report.decode().split())
        self._close_exit_fd()

    def _await_report(self, seconds: float) -> None:
        """Spin (yielding the CPU) up to ``seconds`` for the guard's next report."""
        give_up = clocks.monotonic() + seconds
        while not fd_readable(self._sock.fileno()) and clocks.monotonic() < give_up:
            os.sched_yield()

    def _close_exit_fd(self) -> None:
        if self._exit_fd is not None:
            os.close(self._exit_fd)
            self._exit_fd = None

    def _note(self, words: list[str]) -> None:
        verb = words[0]
        if verb == REPORT_STOPPED:
            self.stopped_by = int(words[1])
        elif verb == REPORT_EXITED:
            self.status, self.orphans = int(words[1]), int(words[2])
            self.exited_at = float(words[3])
        elif verb == REPORT_BACKSTOP:
            self.backstop_fired = True
        elif verb == REPORT_EMPTY:
            self.tree_empty = True
            self._collect_guard()

    def _order(self, *words: object) -> None:
        if self.tree_empty:
            return
        with suppressed(OSError):  # the guard is gone: poll() finds out
            self._sock.send(encode(*words))

    def _take_over(self) -> None:
        """The guard died without the tree being empty. As a subreaper we inherited the
        tree: kill all of it, and reap it."""
        self.guard_died = True
        give_up = clocks.monotonic() + TAKE_OVER_S
        while clocks.monotonic() < give_up:
            self._collect_guard()
            left = proctree.descendants(os.getpid())
            if not left:
                break
            proctree.signal_all(left, signal.SIGKILL)
            _reap_all()
        self.tree_empty = True

    def _collect_guard(self) -> None:
        with suppressed(ChildProcessError):
            os.waitpid(self.guard_pid, os.WNOHANG)
        _reap_all()


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it exits); None where there are none (before Linux
    5.3) or the process is gone. (Reaped and its pid taken again, it is another's pidfd:
    that wakes the wrapper once, for nothing.)"""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _reap_all() -> None:
    """Collect every exited child of ours without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _foreground_own_group(terminal_fd: int) -> None:
    os.setpgrp()
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    with suppressed(OSError):
        os.tcsetpgrp(terminal_fd, os.getpgrp())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)


class Terminal:
    """Hands the controlling terminal to the child's group, so Ctrl-C, Ctrl-Z and reads from
    the terminal behave as without tasklock; gives it back when the child is done."""

    def __init__(self) -> None:
        self.fd: int | None = None
        try:
            if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
                self.fd = 0
        except OSError:
            self.fd = None

    @property
    def handed_over(self) -> bool:
        return self.fd is not None

    def suspend_with(self, child: Child) -> None:
        """The child was stopped by job control (Ctrl-Z): stop ourselves too, like a shell
        job, and continue it when we are continued. The lease keeps running meanwhile."""
        signum = child.stopped_by
        child.stopped_by = None
        if not self.handed_over or signum not in JOB_CONTROL_STOPS:
            return
        self.take_back()
        # Stop like a shell job; in an orphaned group the kernel drops SIGTSTP and we go on.
        os.kill(os.getpid(), signal.SIGTSTP)
        self.give_to(child.pgid)
        child.signal_group(signal.SIGCONT)

    def give_to(self, pgid: int) -> None:
        self._set_foreground(pgid)

    def take_back(self) -> None:
        self._set_foreground(os.getpgrp())

    def _set_foreground(self, pgid: int) -> None:
        if self.fd is None:
            return
        # A background group calling tcsetpgrp gets SIGTTOU; ignore it for the call.
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            with suppressed(OSError):
                os.tcsetpgrp(self.fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, previous)
