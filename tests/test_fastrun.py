"""The fast `run` parser: what it takes itself, and what it leaves to typer unchanged (the
behaviour of both paths through the real executable is in test_cli_run.py and
test_cli_global_options.py)."""

from __future__ import annotations

import pytest

from tasklock_cli.fastrun import parse


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
