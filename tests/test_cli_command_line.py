"""`run`'s options end at the command (contract v3, "Synopsis"): one rule, ``run_args``, used by
both parsers. Every case runs through the real executable (whose fast parser takes a plain
`run` without the CLI framework) and through the typer command line alone, which must reach
the same decision."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasklock_cli.cli.argv import run_args
from tasklock_cli.cli.fastrun import parse
from tasklock_cli.errors import UsageError
from tests.support.cli import executable

TYPER_ONLY = "import sys; from tasklock_cli.cli.app import main; main(sys.argv[1:])"
PATHS = {
    "executable": lambda: [executable()],
    "typer": lambda: [sys.executable, "-c", TYPER_ONLY],
}

#: (argv, exit code, stdout, the start of stderr)
CASES = [
    (["run", "k", "ls", "-d", "/"], 0, "/\n", ""),
    (["run", "k", "echo", "hi", "-q", "--note", "x"], 0, "hi -q --note x\n", ""),
    (["run", "k", "echo", "--ttl", "5s", "--", "-v"], 0, "--ttl 5s -- -v\n", ""),
    (["run", "k", "--", "printf", "%s\n", "--help"], 0, "--help\n", ""),
    (["run", "k", "--ttl", "5s", "-q", "echo", "a"], 0, "a\n", ""),
    (["run", "--ttl=5s", "k", "--note", "-v", "echo", "b"], 0, "b\n", ""),  # -v: the note
    (["run", "k", "--ttl", "1s", "--ttl", "5s", "sh", "-c", "echo ${#TASKLOCK_KEY}"], 0, "1\n", ""),
    (["-q", "run", "k", "-vq", "echo", "c"], 2, "", "tasklock: error: -v and -q exclude"),
    (["run", "job", "-q", "--", "sh", "-c", "echo x >&2"], 0, "", "x\n"),
    (["run", "k", "-v", "echo", "d"], 0, "d\n", "tasklock: acquired 'k'"),
    (
        ["run", "k", "--no-record-args", "echo", "e", "--no-record-args"],
        0,
        "e --no-record-args\n",
        "",
    ),
    (["run", "--", "echo", "hi"], 2, "", "tasklock: error: no KEY before '--'"),
    (["run", "--ttl", "5s", "--", "k", "echo"], 2, "", "tasklock: error: no KEY before '--'"),
    (["run", "k"], 2, "", "tasklock: error: no command given"),
    (["run", "k", "--"], 2, "", "tasklock: error: no command given"),
    (["run"], 2, "", "tasklock: error: Missing argument 'KEY'"),
    (["run", "k", "--tll", "5s", "echo"], 2, "", "tasklock: error: No such option: --tll"),
    (["run", "k", "--ttl"], 2, "", "tasklock: error: Option '--ttl' requires an argument"),
    (["run", "k", "--limit", "x", "echo"], 2, "", "tasklock: error: "),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("argv", "code", "stdout", "stderr"), CASES, ids=lambda v: repr(v))
def test_both_parsers_reach_one_decision(cli_env, sqlite_url, path, argv, code, stdout, stderr):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    result = subprocess.run(
        [*PATHS[path](), *argv], env=env, capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stdout) == (code, stdout), result.stderr
    assert result.stderr.startswith(stderr), result.stderr
    if code == 2:
        assert len(result.stderr.splitlines()) == 1, result.stderr


@pytest.mark.parametrize("path", PATHS)
def test_the_commands_own_help_is_the_commands(cli_env, sqlite_url, path):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    result = subprocess.run(
        [*PATHS[path](), "run", "k", "grep", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "grep" in result.stdout
    assert "tasklock" not in result.stdout


def test_runs_own_help_before_the_command(cli_env):
    result = subprocess.run(
        [executable(), "run", "k", "--help"], env=cli_env, capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "Usage: tasklock run" in result.stdout


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "k", "ls", "-la"], ["run", "k", "--", "ls", "-la"]),
        (["--store", "x", "run", "--ttl", "5s", "k", "-q", "ls"],
         ["--store", "x", "run", "--ttl", "5s", "k", "-q", "--", "ls"]),
        (["run", "k", "--note", "-v", "ls"], ["run", "k", "--note", "-v", "--", "ls"]),
        (["run", "k", "--", "ls"], ["run", "k", "--", "ls"]),
        (["run", "k", "--bogus", "ls"], ["run", "k", "--bogus", "ls"]),  # the parser reports it
        (["peek", "k", "--json"], ["peek", "k", "--json"]),
        (["--store", "run", "peek", "k"], ["--store", "run", "peek", "k"]),  # "run": a value
    ],
)  # fmt: skip
def test_run_args_marks_where_the_command_starts(argv, expected):
    assert run_args(argv) == expected


def test_run_args_refuses_a_double_dash_before_the_key():
    with pytest.raises(UsageError, match="no KEY before"):
        run_args(["run", "--", "echo", "hi"])


def test_the_fast_parser_takes_what_run_args_marked():
    parsed = parse(run_args(["run", "k", "--ttl", "5s", "echo", "hi", "-q", "--note", "x"]))
    assert parsed is not None
    assert (parsed.key, parsed.flags, parsed.note) == ("k", {"ttl": "5s"}, None)
    assert parsed.after == {}
    assert parsed.command == ["echo", "hi", "-q", "--note", "x"]
