"""The child: spawned in its own process group, signalled as a group, reaped with its orphans."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

from tasklock_cli.errors import CommandNotExecutable, CommandNotFound

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphaned grandchildren are re-parented to us, so we reap them (no zombies) and the
    process group stays observable until it is really gone. Linux only; harmless elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class Child:
    """One command in its own process group."""

    def __init__(
        self, command: list[str], env: dict[str, str], terminal_fd: int | None = None
    ) -> None:
        if terminal_fd is not None:
            # Take the terminal in the child itself, before exec: otherwise a command that
            # reads at once can meet the terminal still ours, and be stopped by SIGTTIN.
            group: dict = {"preexec_fn": lambda: _foreground_own_group(terminal_fd)}
        elif sys.version_info >= (3, 11):
            group = {"process_group": 0}
        else:
            group = {"preexec_fn": os.setpgrp}
        try:
            self._popen = subprocess.Popen(command, env=env, close_fds=True, **group)
        except FileNotFoundError:
            raise CommandNotFound(f"command not found: {command[0]}") from None
        except (PermissionError, IsADirectoryError):
            raise CommandNotExecutable(f"command not executable: {command[0]}") from None
        except OSError as exc:
            raise CommandNotExecutable(f"cannot run {command[0]}: {exc.strerror}") from None
        self.pid = self._popen.pid
        self.pgid = self.pid
        self.status: int | None = None  # the raw wait status once the child has exited
        self.stopped_by: int | None = None

    @property
    def exited(self) -> bool:
        return self.status is not None

    def exit_code(self) -> int:
        """The child's code, or 128+N when it was killed by signal N."""
        assert self.status is not None
        if os.WIFSIGNALED(self.status):
            return 128 + os.WTERMSIG(self.status)
        return os.WEXITSTATUS(self.status)

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def group_alive(self) -> bool:
        """True while any process of the child's group remains (the child included)."""
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def reap(self) -> None:
        """Collect every exited child (ours and adopted orphans) without blocking."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid != self.pid:
                continue
            if os.WIFSTOPPED(status):
                self.stopped_by = os.WSTOPSIG(status)
                continue
            self.status = status
            self._popen.returncode = self.exit_code()  # so Popen never waits on it again


def _foreground_own_group(terminal_fd: int) -> None:
    os.setpgrp()
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    with contextlib.suppress(OSError):
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
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.fd, pgid)
        finally:
            signal.signal(signal.SIGTTOU, previous)
