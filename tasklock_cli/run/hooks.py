"""The hooks of a run (``--on-start``, ``--on-success``, ``--on-failure``,
``--on-conflict``, ``--on-lost``): a shell command for each event, for monitoring.

Imported only when a hook is given: a run without one pays nothing for this module.

- Each hook runs as ``sh -c CMD``, with the command's ``TASKLOCK_*`` variables and
  ``TASKLOCK_EVENT``, ``TASKLOCK_EXIT_CODE`` (when the command ran) and
  ``TASKLOCK_DURATION_S`` (the command's run time; 0 when it did not run).
- Its output goes to tasklock's stderr; its stdin is /dev/null.
- It runs in a process group of its own, and inherits no descriptor but 0, 1 and 2 (the
  store's connections are close-on-exec, and ``close_fds`` closes the rest).
- It gets ``--hook-timeout``; then its group is killed. Whatever it left running in its
  group when it ends is killed too; and if tasklock dies meanwhile, a watchdog in the
  group kills it: a hook never outlives tasklock.
- A hook that fails or times out is a ``warning`` event. It never changes tasklock's exit
  code, and never holds the lock: ``on-start`` runs before the command (bounded by half the
  lease, which is renewed after it when it ran long), the others after the release.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from tasklock_cli.errors import TasklockError
from tasklock_cli.events import EventLog
from tasklock_cli.run.holding import Holding
from tasklock_cli.run.options import RunOptions


class Hooks:
    """The hooks of one run, fired at its events."""

    def __init__(self, options: RunOptions, events: EventLog) -> None:
        self.options = options
        self.commands = options.hooks
        self.timeout = options.hook_timeout
        self.key = options.key
        self.events = events

    def conflict(self, env: dict[str, str]) -> None:
        """The lock was not acquired (held, queue full, superseded)."""
        self.fire("conflict", env)

    def around_command(
        self,
        env: dict[str, str],
        holding: Holding,
        run_child: Callable[[], int],
        ended: Callable[[], tuple[bool, int | None]],
    ) -> int:
        """Run the command (``run_child``, holding the leases of ``holding``) between
        ``on-start`` and the after-command hooks, which run once the lease is released
        (``on-lost`` then ``on-failure``, or ``on-success``, as ``ended`` says: lost, the
        command's exit code); the run's exit code, whatever the hooks do."""
        window = self.options.lease_window
        self.fire("start", env, timeout=min(self.timeout, window / 2))
        holding.ensure_remaining(window / 2, self.options.schedule.io_timeout)
        started = time.monotonic()
        try:
            code = run_child()
        except TasklockError as exc:  # the command could not start (126, 127)
            self.after(env, False, int(exc.exit_code), time.monotonic() - started)
            raise
        lost, ran = ended()
        self.after(env, lost, code if ran is None else ran, time.monotonic() - started)
        return code

    def after(self, env: dict[str, str], lost: bool, exit_code: int, took: float) -> None:
        """The after-command hooks: on a loss ``on-lost``, then ``on-failure``."""
        ran = {"TASKLOCK_EXIT_CODE": str(exit_code)}
        if lost:
            self.fire("lost", {**env, **ran}, took)
        event = "success" if exit_code == 0 and not lost else "failure"
        self.fire(event, {**env, **ran}, took)

    def fire(
        self, event: str, env: dict[str, str], took: float = 0.0, timeout: float | None = None
    ) -> None:
        """Run the hook of ``event``, if given, and wait for it (at most the timeout)."""
        command = self.commands.get(event)
        if command is None:
            return
        env = {**env, "TASKLOCK_EVENT": event, "TASKLOCK_DURATION_S": f"{took:.3f}"}
        problem = run_hook(command, env, self.timeout if timeout is None else timeout)
        if problem is not None:
            self.events.warning(
                f"the on-{event} hook of {self.key!r} {problem}; the run goes on as it would",
                key=self.key,
                hook=f"on-{event}",
            )


def run_hook(command: str, env: dict[str, str], timeout: float) -> str | None:
    """Run ``sh -c command`` (output to our stderr) for at most ``timeout`` seconds, then
    kill its process group; what went wrong, or None.

    The watchdog starts first, in a new group, and the hook joins that group: so there is
    no moment when the hook runs and tasklock could die without taking it along."""
    watchdog = _Watchdog.start()
    group = watchdog.process.pid if watchdog is not None else 0
    try:
        process = subprocess.Popen(
            ["sh", "-c", command],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=2,
            close_fds=True,
            **_in_group(group),  # (0: a new group of its own, without a watchdog)
        )
    except OSError as exc:
        if watchdog is not None:
            _kill_group(group)
            watchdog.close()
        return f"could not start ({exc.strerror})"
    group = group or process.pid
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill_group(group)
        process.wait()
        return f"was killed after {timeout:g}s (--hook-timeout)"
    finally:
        _kill_group(group)  # what it left running in its group, the watchdog too
        if watchdog is not None:
            watchdog.close()
    if code != 0:
        return f"exited {code}" if code > 0 else f"was killed by signal {-code}"
    return None


class _Watchdog:
    """The first process of a hook's process group, which kills the group when tasklock
    dies (SIGKILL, the OOM killer) while the hook runs: it waits on a pipe whose write end
    only tasklock holds (close-on-exec, so not the hook's either), which the kernel closes
    with us."""

    def __init__(self, process: subprocess.Popen, write_end: int) -> None:
        self.process = process
        self.write_end = write_end

    @classmethod
    def start(cls) -> _Watchdog | None:
        """A watchdog in a new process group of its own, for the hook to join; None when it
        could not be started (the hook then runs without one)."""
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            process = subprocess.Popen(
                ["sh", "-c", "read _; kill -KILL 0"],  # (EOF on stdin: we are gone)
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                **_in_group(0),
            )
        except (OSError, subprocess.SubprocessError):
            os.close(write_end)
            return None
        finally:
            os.close(read_end)
        return cls(process, write_end)

    def close(self) -> None:
        """The hook is over (its group killed, the watchdog with it): reap it."""
        os.close(self.write_end)
        self.process.wait()


def _in_group(pgid: int) -> dict:
    """Popen's arguments that start a process in the process group ``pgid`` (0: a new one,
    its own)."""
    if sys.version_info >= (3, 11):
        return {"process_group": pgid}
    return {"preexec_fn": lambda: os.setpgid(0, pgid)}  # pragma: no cover - 3.10 only


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
