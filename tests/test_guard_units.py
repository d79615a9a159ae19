"""The guard process (proc.guard) in-process: the command's environment, group, signals
and descriptors."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.support.cli import wait_until


def test_the_guard_starts_the_command_with_exactly_the_environment_it_was_given(capfdbinary):
    """The environment goes to an already forked guard over its socket: larger than one
    message, values with `=`, empty values and bytes that are not UTF-8 arrive intact."""

    env = {
        "BIG": "x" * 100_000,
        "EQUALS": "a=b==c",
        "EMPTY": "",
        "RAW": os.fsdecode(b"caf\xe9 \xff"),
        **{f"VAR_{n}": str(n) * 50 for n in range(200)},
    }
    assert run_through_guard(["/usr/bin/env", "-0"], env) == 0
    printed = capfdbinary.readouterr().out
    pairs = [item.split(b"=", 1) for item in printed.split(b"\0") if item]
    assert dict(pairs) == {os.fsencode(k): os.fsencode(v) for k, v in env.items()}


def test_the_environment_the_guard_is_forked_with_is_completed_and_overridden_at_start(
    capfdbinary,
):
    """The guard has most of the environment from the fork; the start adds the lease's
    variables, which win over a value of the same name it had."""
    preloaded = {"BIG": "y" * 9_000, "TASKLOCK_FENCING_TOKEN": "stale", "KEPT": "k=v"}
    at_start = {"TASKLOCK_FENCING_TOKEN": "42", "TASKLOCK_SLOT": "0"}
    assert run_through_guard(["/usr/bin/env", "-0"], at_start, preloaded) == 0
    printed = capfdbinary.readouterr().out
    pairs = [item.split(b"=", 1) for item in printed.split(b"\0") if item]
    expected = {**preloaded, **at_start}
    assert dict(pairs) == {os.fsencode(k): os.fsencode(v) for k, v in expected.items()}


def run_through_guard(
    command: list[str], env: dict[str, str], preloaded: dict[str, str] | None = None
) -> int:
    import select

    from tasklock_cli.proc.process import Child

    child = Child(command, preloaded)
    child.start(env)
    while not child.tree_empty:
        select.select([child], [], [], 5)
        child.poll()
    return child.exit_code()


def test_the_command_runs_in_its_own_group_with_default_signals_and_only_fds_0_to_2():
    import select

    from tasklock_cli.proc.process import Child

    child = Child(["sleep", "30"])
    child.start({"PATH": os.environ["PATH"]})
    try:
        with open(f"/proc/{child.pid}/status") as lines:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in lines)
        assert os.getpgid(child.pid) == child.pid  # its group is its own
        ignored = int(status["SigIgn"], 16)
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python's own ignores stay Python's
            assert not ignored & (1 << (signum - 1))
        assert int(status["SigBlk"], 16) == 0
        # (the kernel lets a vfork-ing parent go on in execve before it closes the
        # close-on-exec descriptors: a look right away may still see them, for microseconds;
        # an inherited one would stay)
        wait_until(lambda: _only_standard_fds(child.pid), timeout=2)
    finally:
        child.signal_group(signal.SIGKILL)
        while not child.tree_empty:
            select.select([child], [], [], 5)
            child.poll()


def test_a_command_that_cannot_be_run_is_reported(tmp_path):
    from tasklock_cli.errors import CommandNotExecutable
    from tasklock_cli.errors import CommandNotFound
    from tasklock_cli.proc.process import Child

    with pytest.raises(CommandNotFound, match="command not found: no-such-command"):
        Child(["no-such-command"]).start({"PATH": os.environ["PATH"]})
    with pytest.raises(CommandNotExecutable, match=f"command not executable: {tmp_path}"):
        Child([str(tmp_path)]).start({})
    assert run_through_guard([sys.executable, "-c", "pass"], {}) == 0  # the next one runs


def test_a_guard_whose_command_never_starts_is_ended(tmp_path):
    from tasklock_cli.proc.process import Child

    marker = tmp_path / "ran"
    child = Child(["touch", str(marker)])
    child.cancel()
    assert not marker.exists()
    with pytest.raises(ChildProcessError):
        os.waitpid(child.guard_pid, os.WNOHANG)  # collected


def test_the_start_order_carries_the_first_backstop():
    """A wrapper stopped right after the start, before any other order, still bounds its
    command: the guard has its deadline before the command runs, and kills the tree at it."""
    import select
    import time

    from tasklock_cli.proc.process import Child

    child = Child(["sleep", "30"])
    started = time.monotonic()
    child.start({"PATH": os.environ["PATH"]}, backstop_in=0.3)
    while not child.tree_empty and time.monotonic() - started < 5:
        select.select([child], [], [], 0.1)
        child.poll()
    assert child.backstop_fired
    assert child.tree_empty
    assert 0.3 <= time.monotonic() - started < 2.0


def _only_standard_fds(pid: int) -> bool:
    return sorted(os.listdir(f"/proc/{pid}/fd")) == ["0", "1", "2"]


def test_a_bug_in_the_guard_is_reported_escaped():
    """The guard's last words on a bug are a traceback whose text may carry what a store
    or another user wrote: escaped line by line, as everything else tasklock prints."""
    from tasklock_cli.proc.guard import run_guard

    class Hostile:  # a socket whose every use fails with a terminal's control sequence
        def __getattr__(self, name: str) -> object:
            raise RuntimeError("\x1b]0;pwned\x07 from the store")

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the guard's process: its stderr into the pipe (buffered, as in a log)
        sys.stderr = os.fdopen(write_end, "w")
        run_guard(Hostile(), lambda env, fd: 0, set(), {})  # type: ignore[arg-type]
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        printed = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    assert b"Traceback" in printed and b"\\x1b]0;pwned\\x07 from the store" in printed
    assert b"\x1b" not in printed and b"\x07" not in printed, printed


def test_one_poll_after_a_command_that_left_nothing_reads_the_guards_empty_too():
    """`exited` (no orphans) then `empty`, a moment apart: the poll that reads the first
    waits that moment for the second, so the wrapper releases without sleeping again. (The
    guard's `empty` is sent as the poll starts its wait: deterministic on a loaded machine.)"""
    import _socket
    import time

    from tasklock_cli.proc.process import REPORT_SPIN_S
    from tasklock_cli.proc.process import Child
    from tasklock_cli.proc.protocol import encode

    child = Child.__new__(Child)
    ours, guards = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    child._sock, child._exit_fd, child.guard_pid = ours, None, 0
    child.status = child.exited_at = None
    child.orphans, child.tree_empty, child.stopped_by = 0, False, None
    child.backstop_fired = child.guard_died = False
    child._collect_guard = lambda: None  # type: ignore[method-assign]  # no guard to reap
    waits: list[float] = []

    def guard_reports_empty(seconds: float) -> None:
        waits.append(seconds)
        guards.send(encode("empty"))

    child._await_report = guard_reports_empty  # type: ignore[method-assign]
    guards.send(encode("exited", 0, 0, time.monotonic()))
    child.poll()
    assert child.exited and child.tree_empty
    assert waits == [REPORT_SPIN_S]
    ours.close()
    guards.close()
