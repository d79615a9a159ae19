"""The fast parser for `run`, which sits in front of every cron line and shell-loop step.

- `tasklock [GLOBALS] run KEY [OPTIONS] [--] COMMAND...` is parsed here, from the table of
  run settings.
- `run`'s options end where ``argv.run_args`` says.
- The CLI framework is not imported.
  typer and click cost more than the rest of a run on SQLite.
- Whatever this parser does not recognise goes to the typer command line unchanged.
  That is help, completion, another command, an option it does not know, or a value it
  would have to judge.
- So help, errors and every other command behave exactly as there.
"""

from __future__ import annotations

from tasklock_cli.cli.argv import GLOBAL_VALUES
from tasklock_cli.cli.argv import QUIET
from tasklock_cli.cli.argv import TAKES_VALUE
from tasklock_cli.cli.argv import VERBOSE
from tasklock_cli.config import settings
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field


@dataclass
class FastRun:
    """A plain `run` as the fast parser read it."""

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
        elif name in GLOBAL_VALUES:
            parsed.after[GLOBAL_VALUES[name]] = value
        elif name == "--note":
            parsed.note = value
        elif name == "--also":
            parsed.also.append(value)
        elif name in settings.BY_FLAG:
            setting = settings.BY_FLAG[name]
            if setting.integer and not _is_decimal(value):
                return None  # typer's own message for a non-integer (``²``, ``--5``)
            parsed.flags[setting.name] = int(value) if setting.integer else value
        else:
            return None
    return None  # no `--`: typer decides


def _option(args: list[str], index: int) -> tuple[str | None, str | None, int]:
    """(name, value or None for a flag, next index); name None when not an option."""
    arg = args[index]
    if not arg.startswith("-") or arg == "-":
        return None, None, index
    name, equals, value = arg.partition("=")
    if name in TAKES_VALUE:
        if equals:
            return name, value, index + 1
        if index + 1 >= len(args):
            return None, None, index  # missing value: typer's message
        return name, args[index + 1], index + 2
    if equals:
        return None, None, index
    return arg, None, index + 1


def _global_flag(name: str, into: dict) -> bool:
    if name in VERBOSE:
        into["verbose"] = into.get("verbose", 0) + VERBOSE[name]
        return True
    if name in QUIET:
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
        elif name in GLOBAL_VALUES:
            into[GLOBAL_VALUES[name]] = value
        else:
            return None
    return index


def run_fast(parsed: FastRun, args: list[str]) -> int:
    """Run what ``parse`` read; the exit code, errors reported as the contract says."""
    from tasklock_cli.cli.session import ErrorStyle
    from tasklock_cli.cli.session import GlobalFlags
    from tasklock_cli.cli.session import Globals
    from tasklock_cli.cli.session import fail
    from tasklock_cli.errors import ExitCode
    from tasklock_cli.errors import TasklockError
    from tasklock_cli.events import stop_spinners
    from tasklock_cli.run.command import run_command

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


def _is_decimal(value: str) -> bool:
    """An integer option's value is ASCII digits (util.numbers is imported only for such an
    option: a plain run does without it)."""
    from tasklock_cli.util.numbers import is_decimal

    return is_decimal(value, signed=True)
