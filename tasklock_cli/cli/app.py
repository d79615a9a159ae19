"""Command-line parsing and rendering only; the engine, supervisor and stores do the work."""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Callable
from dataclasses import fields
from functools import update_wrapper
from typing import TYPE_CHECKING
from typing import Any
from typing import NoReturn

import typer
from typer.core import TyperGroup

from tasklock_cli import __version__
from tasklock_cli.cli.argv import run_args
from tasklock_cli.cli.session import ErrorStyle
from tasklock_cli.cli.session import GlobalFlags
from tasklock_cli.cli.session import Globals
from tasklock_cli.cli.session import exit_now
from tasklock_cli.cli.session import fail
from tasklock_cli.config import settings
from tasklock_cli.errors import ExitCode
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.errors import UsageError
from tasklock_cli.events import stop_spinners
from tasklock_cli.run.command import run_command
from tasklock_cli.stores.registry import url_forms
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.durations import parse_duration
from tasklock_cli.util.keys import is_utf8
from tasklock_cli.util.keys import validate_key
from tasklock_cli.util.numbers import is_decimal
from tasklock_cli.util.sanitize import json_text

if TYPE_CHECKING:
    from tasklock_cli.stores.base import Store

try:
    from typer.exceptions import TyperException as _CliException
except ImportError:  # typer releases that use click directly
    # (ignore: mypy checks against one typer, and sees the other branch as a redefinition;
    # unused-ignore: which branch that is depends on the typer installed)
    from click import ClickException as _CliException  # type: ignore[no-redef, unused-ignore]
try:
    from typer._click.globals import get_current_context
except ImportError:  # typer releases that use click directly
    from click import get_current_context  # type: ignore[no-redef, unused-ignore]  # (as above)


GLOBAL_OPTION_NAMES = tuple(field.name for field in fields(GlobalFlags))
GLOBALS_AFTER_COMMAND = (
    "Global options (--store, --config, --log-format, -v, -q) may also come after the command;"
    " one given both before and after it takes the later value."
)
#: run's own: there, what follows COMMAND is COMMAND's (argv.py), global options too.
GLOBALS_AFTER_RUN = (
    "Global options (--store, --config, --log-format, -v, -q) may also come after KEY, before"
    " COMMAND (after COMMAND they are its arguments); one given both before run and after KEY"
    " takes the later value."
)


def is_global_option_copy(param: Any) -> bool:
    """Whether ``param`` is a command's (hidden) copy of a global option."""
    return bool(getattr(param, "tasklock_global_copy", False))


class _GlobalOptionsAnywhere(TyperGroup):
    """Every command also accepts the global options (hidden copies, parsed by the command's
    own parser, so option values such as ``--note -v`` and the ``--`` of ``run`` are respected);
    the values given after the command override those given before it."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        shared = [param for param in self.params if param.name in GLOBAL_OPTION_NAMES]
        for command in self.commands.values():
            _accept_global_options(command, shared)


def _accept_global_options(command: Any, shared: list[Any]) -> None:
    for param in shared:
        clone = copy.copy(param)
        clone.hidden = True
        clone.tasklock_global_copy = True
        command.params.append(clone)
    command.epilog = GLOBALS_AFTER_RUN if command.name == "run" else GLOBALS_AFTER_COMMAND
    command.callback = _applying_later_globals(command.callback)
    _plain_required_metavars(command)


def _plain_required_metavars(command: Any) -> None:
    """Show a required argument in the usage line as its metavar (``KEY``), as the help's
    other lines and the man page do: typer 0.28 puts it in braces (``{KEY}``), which read as
    a set of choices."""
    for param in command.params:
        if param.param_type_name == "argument" and param.required and param.metavar:
            param.get_usage_pieces = lambda ctx, shown=param.metavar: [shown]


def _applying_later_globals(callback: Callable[..., Any]) -> Callable[..., Any]:
    def with_globals(**params: Any) -> Any:
        later = GlobalFlags(**{name: params.pop(name) for name in GLOBAL_OPTION_NAMES})
        ctx = get_current_context()
        ctx.obj = Globals(ctx.obj.then(later.checked()))
        return callback(**params)

    return update_wrapper(with_globals, callback)


app = typer.Typer(
    name="tasklock",
    cls=_GlobalOptionsAnywhere,
    help="Run a command at most once at a time across processes and machines.",
    epilog=(
        "Global options may come before or after COMMAND (for run: after KEY, before the"
        " command it runs); one given in both places takes the later value."
    ),
    add_completion=False,  # completions ship as files in completions/
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


#: The most ``history --limit`` takes: far more than any store keeps, and an integer every
#: store's queries take.
HISTORY_LIMIT_MAX = 2**31 - 1
#: ``list --watch`` refreshes no faster than this: each refresh is a query on the store.
MIN_WATCH_INTERVAL_S = 0.1


def _whole_number(value: str | int) -> int:
    """An integer option's parser: ASCII digits after an optional ``-`` (click's INT
    reads ``٣`` as 3 and refuses ``²`` with a ValueError's words)."""
    if isinstance(value, int):
        return value
    if is_decimal(value.strip(), signed=True):
        return int(value)
    raise typer.BadParameter(f"{value!r} is not a whole number in ASCII digits")


def _token_option(text: str) -> Any:
    """``--token T``: a fencing token, in ASCII digits."""
    return typer.Option(None, "--token", parser=_whole_number, metavar="T", help=text)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tasklock {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    store: str | None = typer.Option(
        None,
        "--store",
        metavar="URL",
        help=f"Store URL: {', '.join(url_forms())} [env: TASKLOCK_STORE]",
    ),
    config: str | None = typer.Option(
        None, "--config", metavar="FILE", help="Config file (TOML) [env: TASKLOCK_CONFIG]"
    ),
    log_format: str | None = typer.Option(
        None,
        "--log-format",
        metavar="text|json",
        help="Events on stderr as text or one JSON object per line.  [default: text]",
    ),
    verbose: int = typer.Option(
        0,
        "-v",
        "--verbose",
        count=True,
        show_default=False,
        help="Show every event; tracebacks on errors.",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="Only errors on stderr."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    # The command's wrapper (_applying_later_globals) completes these with the global options
    # given after the command name, and puts the Globals in the command's context.
    # for an error met before the command's own options are read
    ErrorStyle.log_format = log_format
    ctx.obj = GlobalFlags(store, config, log_format, verbose, quiet).checked()


# -- run ---------------------------------------------------------------------------------


def run(
    ctx: typer.Context,
    key: str,
    command: list[str] | None,
    note: str | None,
    also: list[str] | None,
    **given: str | int | None,
) -> None:
    """Run COMMAND while holding the lock KEY."""
    flags = {setting.name: given.get(setting.field) for setting in settings.RUN_SETTINGS}
    switches = {switch.name for switch in settings.RUN_SWITCHES if given.get(switch.parameter)}
    raise typer.Exit(run_command(ctx.obj, key, command, flags, note, switches, also or ()))


def _setting_option(setting: settings.RunSetting) -> Any:
    """A run setting's typer option (an integer's digits checked as ASCII)."""
    parser = _whole_number if setting.integer else None
    return typer.Option(
        None, setting.flag, metavar=setting.metavar, help=setting.help, parser=parser
    )


def _run_signature() -> inspect.Signature:
    """run's parameters, its options derived from the table of run settings."""
    keyword = inspect.Parameter.KEYWORD_ONLY

    def param(name: str, default: Any, annotation: Any) -> inspect.Parameter:
        return inspect.Parameter(name, keyword, default=default, annotation=annotation)

    options = [
        param(
            setting.field,
            _setting_option(setting),
            (int | None) if setting.integer else (str | None),
        )
        for setting in settings.RUN_SETTINGS
    ]
    switches = [
        param(switch.parameter, typer.Option(False, switch.flag, help=switch.help), bool)
        for switch in settings.RUN_SWITCHES
    ]
    return inspect.Signature(
        [
            param("ctx", inspect.Parameter.empty, typer.Context),
            param(
                "key",
                typer.Argument(..., metavar="KEY", help="The lock's name, e.g. invoices:nightly."),
                str,
            ),
            param(
                "command",
                typer.Argument(
                    None,
                    metavar="[--] COMMAND [ARG...]",
                    help="The command to run while the lock is held.",
                ),
                list[str] | None,
            ),
            *options,
            *switches,
            param(
                "note",
                typer.Option(None, "--note", metavar="TEXT", help="Shown by peek and list."),
                str | None,
            ),
            param(
                "also",
                typer.Option(
                    None,
                    "--also",
                    metavar="KEY2",
                    help="Hold KEY2 too, all or nothing, in the same mode (repeatable); keys "
                    "are taken in sorted order, so runs naming them in any order never "
                    "deadlock.",
                ),
                list[str] | None,
            ),
        ]
    )


# (ignore: a function takes any attribute; mypy knows only FunctionType's)
run.__signature__ = _run_signature()  # type: ignore[attr-defined]
app.command(context_settings={"allow_interspersed_args": True})(run)


# -- inspection --------------------------------------------------------------------------


@app.command()
def peek(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="The lock's name."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show who holds KEY and who waits for it; exit 0 when held, 1 when free."""
    from tasklock_cli.cli import render

    g: Globals = ctx.obj
    validate_key(key, forged=True)
    with g.open_store() as store:
        _byte_key_reachable(store, key)
        holders = store.holders(key)
        waiters = store.waiters(key)
        quarantine = store.quarantine()
    if as_json:
        typer.echo(json_text(render.peek_json(key, holders, waiters)))
    else:
        if holders:
            render.lease_details(holders)
        render.waiters_block(key, waiters, held=bool(holders))
    _warn_of_quarantine(g, quarantine)
    raise typer.Exit(0 if holders else 1)


def _checked_prefix(prefix: str) -> None:
    """UsageError for a ``--prefix`` that is not UTF-8 (bytes on the command line that no
    driver could send as text; a forged key is listed under a prefix that is)."""
    if not is_utf8(prefix):
        raise UsageError("--prefix is not valid UTF-8")


def _byte_key_reachable(store: Store, key: str) -> None:
    """UsageError for a key that is not UTF-8 (``validate_key(forged=True)``) on a store
    that cannot hold one (``Store.byte_keys``): no writer can have made it there."""
    if not store.byte_keys and not is_utf8(key):
        raise UsageError("the lock key is not valid UTF-8 (this store holds no such key)")


def _warn_of_quarantine(g: Globals, quarantine: str | None) -> None:
    """A failover quarantine keeps every key from new holders, free ones too: a warning on
    stderr (the JSON on stdout keeps the contract's shape)."""
    if quarantine is not None:
        g.events.warning(quarantine, quarantine=True)


@app.command("list")
def list_leases(
    ctx: typer.Context,
    prefix: str = typer.Option("", "--prefix", metavar="P", help="Only keys starting with P."),
    show_all: bool = typer.Option(False, "--all", help="Include expired leases not yet swept."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array."),
    watch: bool = typer.Option(False, "--watch", help="Refresh the listing until interrupted."),
    interval: str = typer.Option("1s", "--interval", metavar="D", help="Refresh interval."),
) -> None:
    """List held locks: who holds what, until when."""
    from tasklock_cli.cli import render

    g: Globals = ctx.obj
    _checked_prefix(prefix)
    if watch and as_json:
        raise UsageError("--watch and --json exclude each other")
    every = parse_duration(interval, option="--interval", allow_inf=False)
    if every < MIN_WATCH_INTERVAL_S:
        raise UsageError(f"--interval must be at least {format_duration(MIN_WATCH_INTERVAL_S)}")
    with g.open_store() as store:

        def fetch() -> tuple[list, dict[str, int]]:
            waiting = store.waiting_counts(prefix)
            return list(store.list(prefix=prefix, include_expired=show_all)), waiting

        if watch:
            status = render.watch_table(fetch, every)
            if status:
                raise typer.Exit(status)
            return
        waiting = store.waiting_counts(prefix)
        leases = store.list(prefix=prefix, include_expired=show_all)
        if as_json:
            render.json_array(render.listing_json(leases, waiting))
        else:
            render.lease_table(leases, waiting)
        _warn_of_quarantine(g, store.quarantine())


@app.command()
def history(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="The lock's name."),
    limit: int | None = typer.Option(
        None,
        "--limit",
        metavar="N",
        help="Only the last N runs.  [default: all kept]",
        parser=_whole_number,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, newest first."),
) -> None:
    """Show the run ledger of KEY: past runs (outcome, exit code, holder), newest first."""
    from tasklock_cli.cli import render
    from tasklock_cli.stores.model import LEDGER_KEEP

    g: Globals = ctx.obj
    validate_key(key, forged=True)
    if limit is not None and not 1 <= limit <= HISTORY_LIMIT_MAX:
        raise UsageError(f"--limit must be from 1 to {HISTORY_LIMIT_MAX} (got {limit})")
    with g.open_store() as store:
        _byte_key_reachable(store, key)
        runs = store.history(key, limit or LEDGER_KEEP)
    if as_json:
        render.json_array(run.to_json() for run in runs)
    else:
        render.history_table(key, runs)


@app.command()
def metrics(
    ctx: typer.Context,
    prefix: str = typer.Option("", "--prefix", metavar="P", help="Only keys starting with P."),
) -> None:
    """Print Prometheus metrics (text format) from the run ledger and the live leases."""
    from tasklock_cli.commands.metrics import collect
    from tasklock_cli.commands.metrics import exposition

    g: Globals = ctx.obj
    _checked_prefix(prefix)
    with g.open_store() as store:
        per_key = collect(store, prefix)
    sys.stdout.write("".join(line + "\n" for line in exposition(per_key)))


@app.command()
def check(
    ctx: typer.Context,
    key: str | None = typer.Argument(
        None, metavar="[KEY]", help="The lock's name.  [default: $TASKLOCK_KEY]"
    ),
    token: int | None = _token_option(
        "The lease's fencing token.  [default: $TASKLOCK_FENCING_TOKEN]"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Inside a command run by tasklock: exit 0 (printing the seconds left) while its lease
    is current, 70 when it is not."""
    from tasklock_cli.commands import check as checking
    from tasklock_cli.errors import LeaseLost

    g: Globals = ctx.obj
    key, token = checking.target(key, token)
    with g.open_store() as store:
        result = checking.check(store, key, token)
    if as_json:
        typer.echo(json_text(result.to_json()))
        raise typer.Exit(0 if result.current else LeaseLost.exit_code)
    if not result.current:
        raise checking.not_current(result)
    typer.echo(f"{result.expires_in:.3f}")


@app.command()
def sweep(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Only count what would be removed."),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"removed": N} ({"would_remove": N} with --dry-run).'
    ),
) -> None:
    """Remove expired leases left in the store (fencing counters are kept)."""
    g: Globals = ctx.obj
    with g.open_store() as store:
        removed = store.sweep(dry_run=dry_run)
    if as_json:
        typer.echo(json_text({"would_remove" if dry_run else "removed": removed}))
    else:
        verb = "would remove" if dry_run else "removed"
        typer.echo(f"{verb} {removed} expired lease{'' if removed == 1 else 's'}")


@app.command()
def release(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="The lock's name."),
    force: bool = typer.Option(False, "--force", help="Required: this breaks a live lease."),
    token: int | None = _token_option("Break only the lease with fencing token T."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Break the lease on KEY (ops): its holder terminates its command and lets go at once.
    A holder that does not answer within 10s keeps the key, broken, until its lease runs
    out (exit 75)."""
    g: Globals = ctx.obj
    validate_key(key, forged=True)
    if not force:
        raise UsageError("release breaks whoever holds the lock; confirm with --force")
    if token is not None:
        from tasklock_cli.commands.check import checked_token

        checked_token(token)
    from tasklock_cli.commands.release import break_and_wait
    from tasklock_cli.commands.release import let_go_timeout
    from tasklock_cli.run.holding import current_holder

    timeout = let_go_timeout()
    with g.open_store() as store:
        _byte_key_reachable(store, key)
        outcome = break_and_wait(store, key, token, timeout, by=current_holder([], None))
        quarantine = store.quarantine()
    from tasklock_cli.cli import render

    if as_json:
        typer.echo(json_text(render.break_outcome_json(key, outcome)))
    else:
        typer.echo(render.break_outcome(key, token, outcome, timeout))
    _warn_of_quarantine(g, quarantine)
    raise typer.Exit(0 if outcome.freed else ExitCode.CONFLICT)


@app.command()
def init(
    ctx: typer.Context,
    print_sql: bool = typer.Option(
        False, "--print-sql", help="Print the DDL instead of running it (for DBAs)."
    ),
) -> None:
    """Create the store's schema explicitly (SQL stores; others need none)."""
    g: Globals = ctx.obj
    with g.open_store() as store:
        if print_sql:
            sql = store.schema_sql()
            typer.echo(sql if sql is not None else "-- this store needs no schema")
            return
        found = store.init_schema()
        typer.echo(f"store ready: {store.display_url}" + (f": {found}" if found else ""))


@app.command()
def doctor(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print the checks as a JSON array."),
) -> None:
    """Check the store: reachable, schema, round-trip time, clock skew."""
    from tasklock_cli.cli import render
    from tasklock_cli.stores.traits import Capabilities

    g: Globals = ctx.obj
    config_file = str(g.config.path) if g.config.path else "none (built-in defaults)"
    with g.open_store() as store:
        checks = store.doctor()
        capabilities = Capabilities.of(store)
    if as_json:
        typer.echo(json_text(render.doctor_json(config_file, checks, capabilities)))
    else:
        render.doctor_report(config_file, checks, capabilities)
    failed = [check for check in checks if not check.ok]
    if any(check.name == "reachable" for check in failed):
        raise typer.Exit(StoreUnavailable.exit_code)
    if failed:
        raise typer.Exit(ExitCode.CONFIG)


# -- entry point ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> NoReturn:
    exit_now(run_cli(argv))


def run_cli(argv: list[str] | None = None) -> int:
    """The whole command line, returning its exit code (main exits with it)."""
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else argv
    try:
        code = command.main(args=run_args(args), prog_name="tasklock", standalone_mode=False)
    except TasklockError as exc:
        return _fail(str(exc), exc.exit_code, args)
    except _CliException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `tasklock`: the help, as usage
            sys.stderr.write(exc.format_message() + "\n")
            return 2
        return _fail(_message(exc), getattr(exc, "exit_code", 2), args)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        return _fail("aborted", 130, args)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    finally:
        stop_spinners()  # whatever ended the run, the terminal gets its cursor back
    return code if isinstance(code, int) else 0


def _message(exc: _CliException) -> str:
    """The parser's message, suggesting only options close to a mistyped one."""
    possibilities = getattr(exc, "possibilities", None)
    if possibilities:
        from tasklock_cli.util.suggest import close_names

        # (ignores: these are NoSuchOption's, the only exception with possibilities)
        exc.possibilities = close_names(  # type: ignore[attr-defined]
            exc.option_name,  # type: ignore[attr-defined]
            possibilities,
        )
    return exc.format_message()


def _fail(message: str, code: int, args: list[str]) -> int:
    return fail(message, code, args)
