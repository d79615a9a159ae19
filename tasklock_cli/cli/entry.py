"""The `tasklock` entry point: where `run`'s options end (``run_args``, used by both parsers),
and a fast path for the command that sits in front of every cron line and shell-loop step:
`tasklock [GLOBALS] run KEY [OPTIONS] [--] COMMAND...` is parsed here, from the table of run
settings, without importing the CLI framework (typer and click cost more than the rest of a
run on SQLite). Whatever this parser does not recognise (help, completion, another command,
an option it does not know, a value it would have to judge) goes to the typer command line
unchanged, so help, errors and every other command behave exactly as there.
"""

from __future__ import annotations

import sys

from tasklock_cli.config import settings
from tasklock_cli.errors import UsageError
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

_GLOBAL_VALUES = {"--store": "store", "--config": "config", "--log-format": "log_format"}
_VERBOSE = {"-v": 1, "--verbose": 1, "-vv": 2, "-vvv": 3}
_QUIET = ("-q", "--quiet")
_HELP = ("-h", "--help")
#: Short flags that may be combined (``-vq``): the global ones and help.
_SHORT_FLAGS = frozenset("vqh")


@dataclass
class FastRun:
    before: dict = field(default_factory=dict)  # global options before `run`
    after: dict = field(default_factory=dict)  # global options after it
    key: str = ""
    flags: dict = field(default_factory=dict)  # run setting name -> text
    note: str | None = None
    command: list[str] = field(default_factory=list)
    switches: set = field(default_factory=set)  # names of run switches whose flag was given
    also: list = field(default_factory=list)  # --also KEY2, in the order given


def parse(args: list[str]) -> FastRun | None:
    """``args`` as a plain `run` with its command after ``--``; None for anything else."""
    parsed = FastRun()
    index = _take_globals(args, 0, parsed.before)
    if index is None or index >= len(args) or args[index] != "run":
        return None
    index += 1
    while index < len(args):
        arg = args[index]
        if arg == "--":
            parsed.command = args[index + 1 :]
            return parsed if parsed.key and parsed.command else None
        name, value, index = _option(args, index)
        if name is None:
            if arg.startswith("-") or parsed.key:
                return None  # unknown option, or a second positional: typer decides
            parsed.key = arg
            index += 1
            continue
        if value is None:
            if name in settings.SWITCHES_BY_FLAG:
                parsed.switches.add(settings.SWITCHES_BY_FLAG[name].name)
            elif not _global_flag(name, parsed.after):
                return None
        elif name in _GLOBAL_VALUES:
            parsed.after[_GLOBAL_VALUES[name]] = value
        elif name == "--note":
            parsed.note = value
        elif name == "--also":
            parsed.also.append(value)
        elif name in settings.BY_FLAG:
            setting = settings.BY_FLAG[name]
            if setting.integer and not value.lstrip("-").isdigit():
                return None  # typer's own message for a non-integer
            parsed.flags[setting.name] = int(value) if setting.integer else value
        else:
            return None
    return None  # no `--`: typer decides


_TAKES_VALUE = {*_GLOBAL_VALUES, "--note", "--also", *settings.BY_FLAG}


def _option(args: list[str], index: int) -> tuple[str | None, str | None, int]:
    """(name, value or None for a flag, next index); name None when not an option."""
    arg = args[index]
    if not arg.startswith("-") or arg == "-":
        return None, None, index
    name, equals, value = arg.partition("=")
    if name in _TAKES_VALUE:
        if equals:
            return name, value, index + 1
        if index + 1 >= len(args):
            return None, None, index  # missing value: typer's message
        return name, args[index + 1], index + 2
    if equals:
        return None, None, index
    return arg, None, index + 1


def _global_flag(name: str, into: dict) -> bool:
    if name in _VERBOSE:
        into["verbose"] = into.get("verbose", 0) + _VERBOSE[name]
        return True
    if name in _QUIET:
        into["quiet"] = True
        return True
    return False


def _take_globals(args: list[str], index: int, into: dict) -> int | None:
    """Global options up to the command name; the index of the command name."""
    while index < len(args) and args[index].startswith("-"):
        name, value, index = _option(args, index)
        if name is None:
            return None
        if value is None:
            if not _global_flag(name, into):
                return None
        elif name in _GLOBAL_VALUES:
            into[_GLOBAL_VALUES[name]] = value
        else:
            return None
    return index


def run_fast(parsed: FastRun, args: list[str]) -> int:
    from tasklock_cli.cli.session import ErrorStyle
    from tasklock_cli.cli.session import GlobalFlags
    from tasklock_cli.cli.session import Globals
    from tasklock_cli.cli.session import fail
    from tasklock_cli.cli.session import run_command
    from tasklock_cli.errors import ExitCode
    from tasklock_cli.errors import TasklockError
    from tasklock_cli.events import stop_spinners

    try:
        before = GlobalFlags(**parsed.before).checked()
        ErrorStyle.log_format = before.log_format
        g = Globals(before.then(GlobalFlags(**parsed.after).checked()))
        return run_command(
            g,
            parsed.key,
            parsed.command,
            parsed.flags,
            parsed.note,
            parsed.switches,
            parsed.also,
        )
    except TasklockError as exc:
        return fail(str(exc), exc.exit_code, args)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    finally:
        stop_spinners()


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
        width = _option_width(args, index, _TAKES_VALUE, settings.SWITCHES_BY_FLAG)
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
        width = _option_width(args, index, _GLOBAL_VALUES)
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
    if name in _VERBOSE or name in _QUIET or name in _HELP or name in (switches or ()):
        return 1
    short = name[1:]
    if not name.startswith("--") and short and _SHORT_FLAGS.issuperset(short):
        return 1
    return 0


def main(argv: list[str] | None = None) -> NoReturn:
    from tasklock_cli.cli.session import exit_now

    args = sys.argv[1:] if argv is None else argv
    try:
        args = run_args(args)
    except UsageError as exc:
        from tasklock_cli.cli.session import fail

        exit_now(fail(str(exc), exc.exit_code, args))
    parsed = parse(args)
    if parsed is not None:
        exit_now(run_fast(parsed, args))
    from tasklock_cli.cli.app import run_cli

    exit_now(run_cli(args))
