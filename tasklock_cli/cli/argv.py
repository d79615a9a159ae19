"""Where `run`'s options end: the one rule both parsers use (``run_args``), and the words
that are options (global ones, `run`'s, those that take a value)."""

from __future__ import annotations

from tasklock_cli.config import settings
from tasklock_cli.errors import UsageError

GLOBAL_VALUES = {"--store": "store", "--config": "config", "--log-format": "log_format"}
VERBOSE = {"-v": 1, "--verbose": 1, "-vv": 2, "-vvv": 3}
QUIET = ("-q", "--quiet")
HELP = ("-h", "--help")
#: Short flags that may be combined (``-vq``): the global ones and help.
SHORT_FLAGS = frozenset("vqh")


TAKES_VALUE = {*GLOBAL_VALUES, "--note", "--also", *settings.BY_FLAG}


def run_args(args: list[str]) -> list[str]:
    """The command line with ``--`` where `run`'s command starts, so that both parsers (this
    one and typer) see one decision: `run`'s options end at the first word after KEY that is
    neither one of its options (global ones included) nor an option's value; from there on
    every word is the command's. Unchanged when that is not `run`, when ``--`` is already
    there, or when an option is unknown or lacks its value (the parser reports it).
    UsageError for ``run -- COMMAND``, which has no key."""
    index = _command_name_at(args)
    if index is None or args[index] != "run":
        return args
    index += 1
    key_seen = False
    while index < len(args):
        arg = args[index]
        if arg == "--":
            if not key_seen:
                raise UsageError(
                    "no KEY before '--' (tasklock run KEY [OPTIONS] [--] COMMAND [ARG...])"
                )
            return args
        if not _is_option_word(arg):
            if key_seen:
                return [*args[:index], "--", *args[index:]]
            key_seen = True
            index += 1
            continue
        width = _option_width(args, index, TAKES_VALUE, settings.SWITCHES_BY_FLAG)
        if not width:
            return args
        index += width
    return args


def _command_name_at(args: list[str]) -> int | None:
    """The index of the command name after the global options; None when there is none
    or an option before it is unknown."""
    index = 0
    while index < len(args) and _is_option_word(args[index]):
        if args[index] == "--":
            return None
        width = _option_width(args, index, GLOBAL_VALUES)
        if not width:
            return None
        index += width
    return index if index < len(args) else None


def _is_option_word(arg: str) -> bool:
    return arg.startswith("-") and arg != "-"


def _option_width(
    args: list[str], index: int, takes_value: set[str] | dict, switches: dict | None = None
) -> int:
    """How many words the option at ``index`` spans (2 with a separate value); 0 when it is
    unknown or its value is missing. ``switches``: the command's own flags without a value."""
    name, equals, _ = args[index].partition("=")
    if name in takes_value:
        return 1 if equals else 2 if index + 1 < len(args) else 0
    if equals:
        return 0
    if name in VERBOSE or name in QUIET or name in HELP or name in (switches or ()):
        return 1
    short = name[1:]
    if not name.startswith("--") and short and SHORT_FLAGS.issuperset(short):
        return 1
    return 0
