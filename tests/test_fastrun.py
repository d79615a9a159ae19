"""The fast `run` parser: what it takes itself, and what it leaves to typer unchanged (the
behaviour of both paths through the real executable is in test_cli_run.py and
test_cli_global_options.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tasklock_cli.cli.fastrun import parse

#: Modules a plain `run` on SQLite must not import: the CLI framework and the network
#: drivers, and what costs start-up time for nothing (issue 18): dataclasses (with inspect,
#: ast, dis, tokenize), typing, traceback (with textwrap), the ctypes package, pathlib and
#: urllib (with ipaddress), getpass (with termios).
NOT_ON_RUNS_PATH = {
    "typer", "click", "rich", "psycopg", "redis", "secrets", "tomllib", "_hashlib",
    "dataclasses", "inspect", "ast", "dis", "tokenize", "typing", "traceback", "textwrap",
    "ctypes", "pathlib", "urllib", "ipaddress", "getpass", "termios",
}  # fmt: skip


def test_a_plain_run_with_global_options_on_both_sides():
    parsed = parse(
        ["--store", "sqlite:///x.db", "-v", "run", "k", "--ttl=5s", "--note", "-v",
         "--conflict-exit-code", "0", "-q", "--log-format", "json", "--", "cmd", "--ttl", "1"]
    )  # fmt: skip
    assert parsed is not None
    assert parsed.before == {"store": "sqlite:///x.db", "verbose": 1}
    assert parsed.after == {"quiet": True, "log_format": "json"}
    assert parsed.key == "k"
    assert parsed.flags == {"ttl": "5s", "conflict-exit-code": 0}
    assert parsed.note == "-v"  # a value, not an option
    assert parsed.command == ["cmd", "--ttl", "1"]  # after --: the command's


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--help"],
        ["run", "--help"],
        ["run", "k", "--help", "--", "true"],
        ["peek", "k"],
        ["run", "k", "true"],  # no --
        ["run", "--", "true"],  # no key
        ["run", "k", "--"],  # no command
        ["run", "k", "j", "--", "true"],  # a second positional
        ["run", "k", "--bogus", "--", "true"],
        ["run", "k", "--ttl"],  # value missing
        ["run", "k", "--conflict-exit-code", "x", "--", "true"],
        ["--version"],
        ["-vq", "run", "k", "--", "true"],  # combined short flags
        ["--verbose=1", "run", "k", "--", "true"],
    ],
)
def test_anything_else_goes_to_typer(args):
    assert parse(args) is None


def test_a_plain_run_on_sqlite_imports_only_what_it_needs(cli_env, sqlite_url):
    """Counted from the moment the interpreter is up: what site imported before (an
    editable install's finder, say) is not the run's."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from tasklock_cli.cli.fastrun import parse, run_fast\n"
        "args = ['run', 'k', '--ttl', '5s', '--', 'true']\n"
        "code = run_fast(parse(args), args)\n"
        "print(code, *sorted(set(sys.modules) - before))\n"
    )
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    code, *imported = result.stdout.split()
    assert code == "0", result.stderr
    assert "tasklock_cli.stores.sqlite.store" in imported  # it did run
    assert not {name.split(".")[0] for name in imported} & NOT_ON_RUNS_PATH
