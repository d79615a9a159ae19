"""The guard: a small process between the wrapper and the command that outlives the wrapper.

The wrapper forks the guard, and the guard starts the command when told to. A run forks
its guard before the acquire: the guard sets itself up while the store is contacted, the
store records it with the lease in the acquire itself, and once the lock is the run's only
the command's start is left between the acquire and the command. The guard is the subreaper
of the command's whole tree, so every process the command starts (one that calls setsid
or double-forks included) stays below it, where it can be found and killed. It does what
the wrapper orders (signal the command's group, signal the tree, kill the tree at a
deadline) and reports what happens (started, stopped, exited, tree empty).

Should the wrapper die (SIGKILL, the OOM killer, a CI runner killing its process group),
its end of the socket closes and the guard terminates the tree at once: SIGTERM, SIGKILL
ORPHANED_GRACE_S later. Should the wrapper be alive but not running (SIGSTOP, a frozen VM)
past the deadline it last gave, the guard kills the tree by itself. Either way the tree
is gone long before the lease can run out on the store.

The messages between the two are in ``protocol``.
"""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost ~2 ms per start
import gc
import os
import select

from tasklock_cli.errors import TasklockError
from tasklock_cli.proc import proctree
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
from tasklock_cli.proc.protocol import encode
from tasklock_cli.proc.protocol import receive
from tasklock_cli.util import clock as clocks
from tasklock_cli.util import signals as signal
from tasklock_cli.util import suppressed
from tasklock_cli.util.durations import INFINITY

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

#: After the wrapper died: SIGTERM to the tree, then SIGKILL this much later.
ORPHANED_GRACE_S = 0.5
#: While killing, look at the tree again this often (a fork can race the kill).
KILL_POLL_S = 0.01
PR_SET_CHILD_SUBREAPER = 36
#: Signals meant for the wrapper or the terminal's job; the guard only follows its wrapper.
_DEAF_TO = (
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTSTP,
    signal.SIGTTIN,
    signal.SIGTTOU,
)
#: Blocked from the fork until the guard has its own handlers (the wrapper's are inherited).
GUARD_SIGNALS = (*_DEAF_TO, signal.SIGCHLD, signal.SIGCONT, signal.SIGALRM)


def become_subreaper() -> None:
    """Orphans below us are re-parented to us instead of init. Linux only; harmless elsewhere."""
    with suppressed(OSError, AttributeError):
        _call_libc("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _call_libc(name: str, *args: int) -> int:
    """``name(*args)`` from the C library, integers passed as C ints as ctypes passes them.
    Through _ctypes' own dlopen/dlsym/call_function: the ctypes package on top of it costs
    ~1.5 ms of every start; ctypes itself where _ctypes lacks them."""
    try:
        import _ctypes

        # dlopen(NULL) is the program itself, as ctypes.CDLL(None) passes it; typeshed
        # allows only a path.
        main_program = _ctypes.dlopen(None)  # type: ignore[arg-type]
        function = _ctypes.dlsym(main_program, name)
        return _ctypes.call_function(function, args)
    except (ImportError, AttributeError):
        import ctypes

        return getattr(ctypes.CDLL(None, use_errno=True), name)(*args)


def run_guard(
    sock: _socket.socket,
    spawn: Callable[[dict[bytes, bytes], int | None], int],
    signal_mask: set[int | signal.Signals],
    environ: dict[str, str] | None = None,
) -> NoReturn:
    """The guard's whole life, in the freshly forked process (forked with GUARD_SIGNALS
    blocked; ``signal_mask`` is the mask to go back to); never returns."""
    code = 1
    try:
        # The wrapper may fork us with its collector off (it imports without it): on, for a
        # life as long as the command's, and never over what we inherited (a pass over it
        # would copy every page it touches).
        gc.freeze()
        gc.enable()
        code = _Guard(sock, environ or {}).run(spawn, signal_mask)
    except BaseException:  # a bug: say where (escaped), then leave the tree to the wrapper
        import sys
        import traceback

        from tasklock_cli.util.sanitize import safe_lines

        sys.stderr.write(safe_lines(traceback.format_exc()))
        sys.stderr.flush()  # (os._exit next: a log file or pipe would lose it)
    finally:
        os._exit(code)  # no interpreter teardown: the wrapper's objects are not ours to close


def _noop(_signum: int, _frame: object) -> None:
    """A handler, not SIG_IGN: handlers are reset at exec, so the command gets the defaults."""


class _Guard:
    def __init__(self, sock: _socket.socket, environ: dict[str, str]) -> None:
        self.sock = sock
        self.environ = environ  # the command's, but what the start order adds
        self.me = os.getpid()
        self.child_pid = 0  # the command's, once started
        self.child_done = False
        self.wrapper_gone_at: float | None = None
        self.backstop_at = INFINITY
        self.terminating = False
        self.killing = False
        self.terminated: set[int] = set()

    def run(self, spawn, signal_mask: set[int | signal.Signals]) -> int:
        wake_r = self._listen_to_signals()
        signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)
        with suppressed(OSError):
            os.setpgid(0, 0)  # a kill of the wrapper's group must leave us to clean up
        become_subreaper()
        start = self._await_start()
        if start is None:  # the wrapper did without the command, or died
            return 0
        try:
            self.child_pid = spawn(*start)
        except TasklockError as exc:
            self._send(REPORT_ERROR, exc.exit_code, str(exc))
            return 0
        self._send(REPORT_STARTED, self.child_pid)
        while True:
            if not self._reap():  # no child left: the tree is gone
                self._send(REPORT_EMPTY)
                return 0
            self._read_orders()
            self._enforce()
            self._sleep(wake_r)

    def _await_start(self) -> tuple[dict[bytes, bytes], int | None] | None:
        """The command's environment and terminal, once the wrapper says start (which also
        sets the first backstop); None when its end of the socket closed first."""
        environ = bytearray()
        # The inherited part made ready before the order comes: the start is on a hand-off.
        env = {os.fsencode(name): os.fsencode(value) for name, value in self.environ.items()}
        while True:
            try:
                order = self.sock.recv(MESSAGE_SIZE)
            except OSError:
                return None
            if order.startswith(ENV_ORDER):
                environ += order[len(ENV_ORDER) :]
            elif order.startswith(START_ORDER):
                break
            elif not order:
                return None
        _, terminal, backstop, last_piece = order.split(b" ", 3)
        environ += last_piece
        terminal_fd = int(terminal)
        # Before the command runs: a wrapper stopped right after the start still bounds it.
        self.backstop_at = float(backstop)
        pairs = (item.partition(b"=") for item in bytes(environ).split(b"\0") if item)
        env.update((name, value) for name, _, value in pairs)
        return env, None if terminal_fd < 0 else terminal_fd

    def _listen_to_signals(self) -> int:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)  # replaces the wrapper's, inherited with the fork
        for signum in (*_DEAF_TO, signal.SIGCHLD):
            signal.signal(signum, _noop)
        return wake_r

    def _reap(self) -> bool:
        """Collect exited children and report on the command; False when none is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid != self.child_pid or self.child_done:
                continue  # an adopted orphan
            if os.WIFSTOPPED(status):
                self._send(REPORT_STOPPED, os.WSTOPSIG(status))
                continue
            self.child_done = True
            self._send(REPORT_EXITED, status, self._count_orphans(), repr(clocks.monotonic()))

    def _count_orphans(self) -> int:
        """The processes the command left running. Orphans are re-parented to us, so with
        no child left there are none, and /proc need not be read."""
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return 0
        return len(proctree.descendants(self.me))

    def _read_orders(self) -> None:
        while self.wrapper_gone_at is None:
            order = receive(self.sock)
            if order is None:
                return
            if not order:
                self._wrapper_gone()
                return
            self._obey(order.decode().split())

    def _obey(self, words: list[str]) -> None:
        verb, argument = words[0], words[1]
        if verb == ORDER_GROUP:
            self._signal_group(int(argument))
        elif verb == ORDER_TREE:
            self._signal_tree(int(argument))
        elif verb == ORDER_BACKSTOP:
            self.backstop_at = float(argument)  # on clock.monotonic, shared by both of us

    def _signal_group(self, signum: int) -> None:
        assert self.child_pid, "orders are read once the command runs"  # never killpg(0)
        if not self.child_done:
            with suppressed(ProcessLookupError, PermissionError):
                os.killpg(self.child_pid, signum)
            return
        # The command is gone; its group lives on only in what it left running.
        members = [pid for pid in proctree.descendants(self.me) if _group_of(pid) == self.child_pid]
        proctree.signal_all(members, signum)

    def _signal_tree(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            self.killing = True
        elif signum == signal.SIGTERM:
            self.terminating = True
        else:
            proctree.signal_all(proctree.descendants(self.me), signum)
        self._enforce()

    def _wrapper_gone(self) -> None:
        self.wrapper_gone_at = clocks.monotonic()
        self.terminating = True

    def _enforce(self) -> None:
        now = clocks.monotonic()
        if self.wrapper_gone_at is not None and now >= self.wrapper_gone_at + ORPHANED_GRACE_S:
            self.killing = True
        if now >= self.backstop_at and not self.killing:
            self.killing = True
            self._send(REPORT_BACKSTOP)
        if self.killing:
            proctree.signal_all(proctree.descendants(self.me), signal.SIGKILL)
        elif self.terminating:  # once to each, including processes started since
            fresh = [pid for pid in proctree.descendants(self.me) if pid not in self.terminated]
            proctree.signal_all(fresh, signal.SIGTERM)
            proctree.signal_all(fresh, signal.SIGCONT)  # a stopped process must run to exit
            self.terminated.update(fresh)

    def _sleep(self, wake_r: int) -> None:
        now = clocks.monotonic()
        wake_at = self.backstop_at
        if self.wrapper_gone_at is not None:
            wake_at = min(wake_at, self.wrapper_gone_at + ORPHANED_GRACE_S)
        timeout = max(0.0, wake_at - now) if wake_at < INFINITY else None
        if self.killing or self.terminating:
            timeout = KILL_POLL_S if timeout is None else min(timeout, KILL_POLL_S)
        watched: list[int | _socket.socket] = (
            [wake_r] if self.wrapper_gone_at is not None else [wake_r, self.sock]
        )
        with suppressed(InterruptedError):
            select.select(watched, [], [], timeout)
        with suppressed(BlockingIOError):
            while os.read(wake_r, 512):
                pass

    def _send(self, *words: object) -> None:
        if self.wrapper_gone_at is not None:
            return
        try:
            self.sock.send(encode(*words))
        except OSError:
            self._wrapper_gone()


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
