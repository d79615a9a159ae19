"""How the guard starts the command (``process.spawn_command``): what it asks of posix_spawnp
and of subprocess, checked with a stand-in and pytest-subprocess, and what becomes of a
command that cannot start, with real files. The real runs end to end are in test_cli_run.py
and test_containment.py."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tasklock_cli.errors import CommandNotExecutable
from tasklock_cli.errors import CommandNotFound
from tasklock_cli.errors import ExitCode
from tasklock_cli.proc.process import spawn_command


def test_without_a_terminal_the_command_is_posix_spawned_in_its_own_group(monkeypatch):
    """No subprocess (its import costs every run ~4 ms): posix_spawnp, as Popen would start
    it (own group, exactly the env, Python's ignored signals back to default, no fds)."""
    calls = []

    def posix_spawnp(*args, **kwargs):
        calls.append((args, kwargs))
        return 42

    monkeypatch.setattr(os, "posix_spawnp", posix_spawnp)
    env = {b"ONLY": b"this", **({b"PATH": os.environb[b"PATH"]} if b"PATH" in os.environb else {})}
    assert spawn_command(["job", "--flag"], env) == 42
    ((args, kwargs),) = calls
    assert args == ("job", ["job", "--flag"], env)  # exactly: nothing of ours added
    assert kwargs["setpgroup"] == 0
    assert set(kwargs["setsigdef"]) == {signal.SIGPIPE, signal.SIGXFSZ}
    assert all(action == os.POSIX_SPAWN_CLOSE for action, _ in kwargs["file_actions"])


def test_a_command_with_another_path_than_ours_goes_through_popen(fp):
    """posix_spawnp would search our PATH, Popen searches the command's."""
    recorder = fp.register(["job", "--flag"])
    spawn_command(["job", "--flag"], {b"ONLY": b"this", b"PATH": b"/elsewhere"})
    (call,) = recorder.calls
    assert call.kwargs["env"] == {b"ONLY": b"this", b"PATH": b"/elsewhere"}
    assert call.kwargs["close_fds"] is True
    if sys.version_info >= (3, 11):
        assert call.kwargs["process_group"] == 0
        assert "preexec_fn" not in call.kwargs  # so subprocess may use vfork
    else:
        assert call.kwargs["preexec_fn"] is os.setpgrp


def test_the_spawned_command_inherits_no_descriptor_but_the_standard_three():
    keep_r, keep_w = os.pipe()
    os.set_inheritable(keep_w, True)  # as one our own parent passed on to us
    try:
        script = f"test -e /proc/$$/fd/{keep_w} && exit 3; exit 0"
        pid = spawn_command(["sh", "-c", script], dict(os.environb))
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(keep_r)
        os.close(keep_w)
    assert os.waitstatus_to_exitcode(status) == 0


def test_on_a_terminal_the_command_takes_it_in_the_child_before_exec(fp):
    recorder = fp.register(["job"])
    spawn_command(["job"], {}, terminal_fd=0)
    (call,) = recorder.calls
    assert callable(call.kwargs["preexec_fn"])
    assert "process_group" not in call.kwargs  # the preexec function makes the group


def test_what_exec_cannot_take_is_an_error_of_the_command_not_a_crash():
    with pytest.raises(CommandNotFound, match="command not found: ''"):
        spawn_command(["", "arg"], {})
    with pytest.raises(CommandNotExecutable, match=r"cannot run true: .*null"):
        spawn_command(["true"], {"X": "a\x00b", "PATH": os.environ["PATH"]})


def test_a_missing_command_is_not_found(tmp_path):
    with pytest.raises(CommandNotFound, match="command not found: ") as raised:
        spawn_command([str(tmp_path / "missing")], {})
    assert raised.value.exit_code == ExitCode.NOT_FOUND
    with pytest.raises(CommandNotFound):
        spawn_command(["tasklock-test-no-such-command"], {"PATH": str(tmp_path)})


@pytest.mark.parametrize("kind", ["file without the x bit", "directory"])
def test_what_cannot_be_executed_is_not_executable(tmp_path, kind):
    target = tmp_path / "target"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_text("#!/bin/sh\nexit 0\n")
        target.chmod(0o644)  # (root too may run only a file with an x bit)
    with pytest.raises(CommandNotExecutable, match="command not executable: ") as raised:
        spawn_command([str(target)], {})
    assert raised.value.exit_code == ExitCode.NOT_EXECUTABLE
