"""How the guard starts the command (``process.spawn_command``): what it asks of subprocess,
checked with pytest-subprocess, and what becomes of a command that cannot start, with real
files. The real runs end to end are in test_cli_run.py and test_containment.py."""

from __future__ import annotations

import os
import sys

import pytest

from tasklock_cli.errors import CommandNotExecutable
from tasklock_cli.errors import CommandNotFound
from tasklock_cli.errors import ExitCode
from tasklock_cli.proc.process import spawn_command


def test_without_a_terminal_the_command_gets_its_own_group_the_env_and_no_descriptors(fp):
    recorder = fp.register(["job", "--flag"])
    process = spawn_command(["job", "--flag"], {b"ONLY": b"this"})
    (call,) = recorder.calls
    kwargs = call.kwargs  # (before `is` narrows call to the Popen that spawn_command returns)
    assert process is call
    assert kwargs["env"] == {b"ONLY": b"this"}  # exactly: nothing of ours added
    assert kwargs["close_fds"] is True
    if sys.version_info >= (3, 11):
        assert kwargs["process_group"] == 0
        assert "preexec_fn" not in kwargs  # so subprocess may use vfork
    else:
        assert kwargs["preexec_fn"] is os.setpgrp


def test_on_a_terminal_the_command_takes_it_in_the_child_before_exec(fp):
    recorder = fp.register(["job"])
    spawn_command(["job"], {}, terminal_fd=0)
    (call,) = recorder.calls
    assert callable(call.kwargs["preexec_fn"])
    assert "process_group" not in call.kwargs  # the preexec function makes the group


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
