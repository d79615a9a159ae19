"""At a terminal the command behaves as without tasklock: reads, Ctrl-C."""

from __future__ import annotations

import os
import pty
import select
import signal
import time
from collections.abc import Callable

import pytest

from tests.support.cli import executable


def _drive_pty(
    args: list[str], env: dict[str, str], act: Callable[[int, bytes, int], None], timeout: float
) -> tuple[int, bytes]:
    """Run under a new pseudo-terminal, calling ``act(pid, output so far)`` before each
    read; the exit code and everything written to the terminal."""
    pid, master = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        os.execve(executable(), [executable(), *args], env)
    output = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        act(pid, output, master)
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
    _, status = os.waitpid(pid, 0)
    os.close(master)
    return os.waitstatus_to_exitcode(status), output


def run_in_pty(
    args: list[str], env: dict[str, str], keystrokes: list[tuple[bytes, bytes]], timeout: float = 20
) -> tuple[int, bytes]:
    """Run under a new pseudo-terminal; send each keystroke once its prompt has appeared."""
    pending = list(keystrokes)

    def type_when_prompted(_pid: int, output: bytes, master: int) -> None:
        if pending and pending[0][0] in output:
            os.write(master, pending.pop(0)[1])

    return _drive_pty(args, env, type_when_prompted, timeout)


@pytest.fixture
def store_url(sqlite_url):
    """These tests run on SQLite alone: ``env`` (conftest) names the store of ``sqlite_url``."""
    return sqlite_url


def test_command_reads_from_the_terminal(env):
    code, output = run_in_pty(
        ["run", "k", "--", "sh", "-c", 'printf "name? "; read name; echo "hello $name"'],
        env,
        [(b"name? ", b"world\n")],
    )
    assert code == 0, output
    assert b"hello world" in output


def test_ctrl_c_reaches_the_command_once(env):
    script = "trap 'echo caught-int; exit 5' INT; echo ready; while :; do sleep 0.05; done"
    code, output = run_in_pty(["run", "k", "--", "sh", "-c", script], env, [(b"ready", b"\x03")])
    assert code == 5, output
    assert output.count(b"caught-int") == 1


def test_waiting_shows_a_spinner_with_the_holder_on_a_terminal(env, sqlite_url):
    from tests.support.cli import start
    from tests.support.cli import wait_for_holder

    holder = start("run", "k", "--note", "busy", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(sqlite_url, "k")
        code, output = run_in_pty(["run", "k", "--wait", "1500ms", "--", "true"], env, [])
        assert code == 75
        assert b"waiting for 'k' held by" in output
        assert f"pid {holder.pid}".encode() in output
        assert b"\x1b[" in output  # drawn in place with terminal controls, not line by line
    finally:
        holder.terminate()
        holder.wait()


def _run_in_pty_then_signal(
    args: list[str], env: dict[str, str], when: bytes, signum: int, timeout: float = 20
) -> tuple[int, bytes]:
    """Run under a new pseudo-terminal; send ``signum`` to tasklock once ``when`` appeared."""
    signalled: list[bool] = []

    def signal_when_shown(pid: int, output: bytes, _master: int) -> None:
        if not signalled and when in output:
            time.sleep(0.3)  # a few spinner frames drawn
            os.kill(pid, signum)
            signalled.append(True)

    return _drive_pty(args, env, signal_when_shown, timeout)


HIDE_CURSOR, SHOW_CURSOR = b"\x1b[?25l", b"\x1b[?25h"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_waiting_restores_the_cursor(env, sqlite_url, signum):
    from tests.support.cli import start
    from tests.support.cli import wait_for_holder

    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(sqlite_url, "k")
        code, output = _run_in_pty_then_signal(
            ["run", "k", "--wait", "30s", "--", "true"], env, b"waiting for", signum
        )
        assert code == 128 + signum, output
        assert HIDE_CURSOR in output  # the spinner did hide it
        assert output.rfind(SHOW_CURSOR) > output.rfind(HIDE_CURSOR), output
    finally:
        holder.terminate()
        holder.wait()


def test_giving_up_and_acquiring_after_a_wait_restore_the_cursor(env, sqlite_url):
    from tests.support.cli import start
    from tests.support.cli import wait_for_holder

    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(sqlite_url, "k")
        code, output = run_in_pty(["run", "k", "--wait", "1s", "--", "true"], env, [])
        assert code == 75
        assert HIDE_CURSOR in output
        assert output.rfind(SHOW_CURSOR) > output.rfind(HIDE_CURSOR), output
    finally:
        holder.terminate()
        holder.wait()
    short = start("run", "k", "--", "sleep", "1", env=env)
    wait_for_holder(sqlite_url, "k")
    code, output = run_in_pty(["run", "k", "--wait", "10s", "--", "echo", "ran"], env, [])
    short.wait()
    assert code == 0 and b"ran" in output
    assert output.rfind(SHOW_CURSOR) > output.rfind(HIDE_CURSOR), output


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ending_list_watch_restores_the_cursor(env, sqlite_url, signum):
    """The live view hides the cursor; SIGTERM (a supervisor, `kill`) or SIGHUP (the
    terminal closed) ends it with the cursor shown again, and exit status 128+N."""
    code, output = _run_in_pty_then_signal(["list", "--watch"], env, b"no locks held", signum)
    assert code == 128 + signum, output
    assert HIDE_CURSOR in output
    assert output.rfind(SHOW_CURSOR) > output.rfind(HIDE_CURSOR), output
