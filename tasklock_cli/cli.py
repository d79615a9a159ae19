"""Command-line parsing and rendering only; the engine, supervisor and stores do the work."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import update_wrapper
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from tasklock_cli import __version__
from tasklock_cli.durations import format_duration, parse_duration
from tasklock_cli.errors import StoreUnavailable, TasklockError, UsageError
from tasklock_cli.events import NORMAL, QUIET, VERBOSE, EventLog, now_rfc3339, stop_spinners
from tasklock_cli.keys import validate_key

try:
    from typer.exceptions import TyperException as _CliException
except ImportError:  # typer releases that use click directly
    from click import ClickException as _CliException
try:
    from typer._click.globals import get_current_context
except ImportError:  # typer releases that use click directly
    from click import get_current_context


@dataclass(frozen=True)
class GlobalFlags:
    """The global options as given on one side of the command name (None / 0: not given)."""

    store: str | None = None
    config: str | None = None
    log_format: str | None = None
    verbose: int = 0
    quiet: bool = False

    def then(self, later: GlobalFlags) -> GlobalFlags:
        """These flags, overridden by those given later (after the command name)."""
        given = {
            name: getattr(later, name)
            for name in ("store", "config", "log_format")
            if getattr(later, name) is not None
        }
        if later.verbose or later.quiet:  # -v and -q set one thing: the verbosity
            given.update(verbose=later.verbose, quiet=later.quiet)
        return replace(self, **given)


GLOBAL_OPTION_NAMES = tuple(field.name for field in fields(GlobalFlags))
GLOBALS_AFTER_COMMAND = (
    "Global options (--store, --config, --log-format, -v, -q) may also come after the command;"
    " one given both before and after it takes the later value."
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
    command.epilog = GLOBALS_AFTER_COMMAND
    command.callback = _applying_later_globals(command.callback)


def _applying_later_globals(callback: Callable[..., Any]) -> Callable[..., Any]:
    def with_globals(**params: Any) -> Any:
        later = GlobalFlags(**{name: params.pop(name) for name in GLOBAL_OPTION_NAMES})
        ctx = get_current_context()
        ctx.obj = Globals(ctx.obj.then(_checked(later)))
        return callback(**params)

    return update_wrapper(with_globals, callback)


app = typer.Typer(
    name="tasklock",
    cls=_GlobalOptionsAnywhere,
    help="Run a command at most once at a time across processes and machines.",
    epilog=(
        "Global options may come before or after COMMAND; one given in both places takes"
        " the later value."
    ),
    add_completion=False,  # completions ship as files in completions/
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Globals:
    def __init__(self, flags: GlobalFlags):
        global _verbose_traceback, _log_format
        log_format = flags.log_format or "text"
        if log_format not in ("text", "json"):
            raise UsageError(f"invalid --log-format {log_format!r} (text or json)")
        _verbose_traceback = flags.verbose > 0
        _log_format = log_format
        self.store_flag = flags.store
        self.config_flag = flags.config
        verbosity = QUIET if flags.quiet else VERBOSE if flags.verbose else NORMAL
        self.events = EventLog(log_format, verbosity)
        self._config = None

    @property
    def config(self):
        if self._config is None:
            from tasklock_cli.config import load_config

            self._config = load_config(self.config_flag)
        return self._config

    def store_url(self) -> str:
        from tasklock_cli.config import resolve_store_url

        return resolve_store_url(self.store_flag, self.config)

    def open_store(self):
        from tasklock_cli.stores import open_store

        return open_store(self.store_url())


_verbose_traceback = False
#: ``list --watch`` refreshes no faster than this: each refresh is a query on the store.
MIN_WATCH_INTERVAL_S = 0.1
#: The parsed --log-format, once main_options has run; errors before that scan argv for it.
_log_format: str | None = None


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
        help="Store URL: sqlite:///PATH, postgresql://..., redis://... [env: TASKLOCK_STORE]",
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
    global _log_format
    _log_format = log_format  # for an error met before the command's own options are read
    ctx.obj = _checked(GlobalFlags(store, config, log_format, verbose, quiet))


def _checked(flags: GlobalFlags) -> GlobalFlags:
    if flags.verbose and flags.quiet:
        raise UsageError("-v and -q exclude each other")
    return flags


# -- run ---------------------------------------------------------------------------------


@app.command(context_settings={"allow_interspersed_args": True})
def run(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="The lock's name, e.g. invoices:nightly."),
    command: list[str] | None = typer.Argument(
        None, metavar="-- COMMAND [ARG...]", help="The command to run while the lock is held."
    ),
    ttl: str | None = typer.Option(
        None,
        "--ttl",
        metavar="D",
        help="Lease length; freed D after the last renewal.  [default: 30s]",
    ),
    renew_every: str | None = typer.Option(
        None,
        "--renew-every",
        metavar="D",
        help="Heartbeat interval, less than --ttl.  [default: ttl/3]",
    ),
    wait: str | None = typer.Option(
        None,
        "--wait",
        metavar="D",
        help="Wait up to D for a held lock; 0 = fail at once, inf = forever.  [default: 0]",
    ),
    grace: str | None = typer.Option(
        None,
        "--grace",
        metavar="D",
        help="On loss: SIGTERM the command's process group, SIGKILL after D.  [default: 5s]",
    ),
    max_lifetime: str | None = typer.Option(
        None,
        "--max-lifetime",
        metavar="D",
        help="Terminate the command when it has run this long.  [default: 24h]",
    ),
    hold_at_least: str | None = typer.Option(
        None,
        "--hold-at-least",
        metavar="D",
        help="Keep the lease until D after acquisition even if the command ends sooner.",
    ),
    conflict_exit_code: int | None = typer.Option(
        None,
        "--conflict-exit-code",
        metavar="N",
        help="Exit code when the lock is held by someone else.  [default: 75]",
    ),
    note: str | None = typer.Option(None, "--note", metavar="TEXT", help="Shown by peek and list."),
) -> None:
    """Run COMMAND while holding the lock KEY."""
    from tasklock_cli.supervisor import RunOptions, Supervisor

    g: Globals = ctx.obj
    validate_key(key)
    if not command:
        raise UsageError("no command given (tasklock run KEY [OPTIONS] -- COMMAND [ARG...])")
    options = RunOptions(
        key=key,
        command=list(command),
        **_run_settings(
            g,
            key,
            {
                "ttl": ttl,
                "renew-every": renew_every,
                "wait": wait,
                "grace": grace,
                "max-lifetime": max_lifetime,
                "hold-at-least": hold_at_least,
                "conflict-exit-code": conflict_exit_code,
            },
        ),
        note=note,
        store_url=g.store_url(),
    )
    with g.open_store() as store:
        code = Supervisor(store, options, g.events).run()
    raise typer.Exit(code)


def _built_in_default(setting: str) -> object:
    """The default of a run setting, as RunOptions declares it (one place for each value)."""
    from dataclasses import fields

    from tasklock_cli.supervisor import RunOptions

    return next(f.default for f in fields(RunOptions) if f.name == setting.replace("-", "_"))


def _run_settings(g: Globals, key: str, flags: dict[str, object]) -> dict[str, object]:
    """Flag > config file (per-key pattern, then file default) > built-in, checked together.
    A bad flag is a usage error; a bad value from the file a config error naming its line."""
    from tasklock_cli.config import INFINITE_SETTINGS, setting_problem

    values: dict[str, object] = {}
    from_file: set[str] = set()
    for name, flag in flags.items():
        if flag is not None:
            value = (
                flag
                if isinstance(flag, int)
                else parse_duration(
                    str(flag), option=f"--{name}", allow_inf=name in INFINITE_SETTINGS
                )
            )
            problem = setting_problem(name, value)
            if problem:
                raise UsageError(f"--{name} {problem}")
            values[name] = value
            continue
        in_file = g.config.run_setting(key, name)
        if in_file is not None:
            from_file.add(name)
        values[name] = in_file if in_file is not None else _built_in_default(name)
    ttl, renew = values["ttl"], values["renew-every"]
    if renew is not None and not renew < ttl:
        problem = f"must be shorter than ttl ({format_duration(ttl)})"
        if {"ttl", "renew-every"} & from_file and not {"ttl", "renew-every"} & set(
            n for n, f in flags.items() if f is not None
        ):
            from tasklock_cli.config import setting_error

            raise setting_error(g.config.path, "renew-every", problem)
        raise UsageError(f"--renew-every {problem}")
    return {name.replace("-", "_"): value for name, value in values.items()}


# -- inspection --------------------------------------------------------------------------


@app.command()
def peek(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="The lock's name."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show who holds KEY; exit 0 when held, 1 when free."""
    g: Globals = ctx.obj
    validate_key(key)
    with g.open_store() as store:
        info = store.peek(key)
    if as_json:
        typer.echo(
            json.dumps(
                {**info.to_json(), "held": True} if info else {"key": key, "held": False},
                ensure_ascii=False,
            )
        )
    elif info is None:
        typer.echo(f"{key} is free")
    else:
        from tasklock_cli import render

        render.lease_details(info)
    raise typer.Exit(0 if info else 1)


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
    from tasklock_cli import render

    g: Globals = ctx.obj
    if watch and as_json:
        raise UsageError("--watch and --json exclude each other")
    every = parse_duration(interval, option="--interval", allow_inf=False)
    if every < MIN_WATCH_INTERVAL_S:
        raise UsageError(f"--interval must be at least {format_duration(MIN_WATCH_INTERVAL_S)}")
    with g.open_store() as store:

        def fetch() -> list:
            return list(store.list(prefix=prefix, include_expired=show_all))

        if watch:
            render.watch_table(fetch, every)
            return
        leases = store.list(prefix=prefix, include_expired=show_all)
        if as_json:
            render.json_array(info.to_json() for info in leases)
        else:
            render.lease_table(leases)


@app.command()
def history(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="The lock's name."),
    limit: int | None = typer.Option(
        None, "--limit", metavar="N", help="Only the last N runs.  [default: all kept]"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON array, newest first."),
) -> None:
    """Show the run ledger of KEY: past runs (outcome, exit code, holder), newest first."""
    from tasklock_cli import render
    from tasklock_cli.stores.base import LEDGER_KEEP

    g: Globals = ctx.obj
    validate_key(key)
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1 (got {limit})")
    with g.open_store() as store:
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
    from tasklock_cli.metrics import collect, exposition

    g: Globals = ctx.obj
    with g.open_store() as store:
        per_key = collect(store, prefix)
    sys.stdout.write("".join(line + "\n" for line in exposition(per_key)))


@app.command()
def check(
    ctx: typer.Context,
    key: str | None = typer.Argument(
        None, metavar="[KEY]", help="The lock's name.  [default: $TASKLOCK_KEY]"
    ),
    token: int | None = typer.Option(
        None,
        "--token",
        metavar="T",
        help="The lease's fencing token.  [default: $TASKLOCK_FENCING_TOKEN]",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Inside a command run by tasklock: exit 0 (printing the seconds left) while its lease
    is current, 70 when it is not."""
    from tasklock_cli import checking
    from tasklock_cli.errors import LeaseLost

    g: Globals = ctx.obj
    key, token = checking.target(key, token)
    with g.open_store() as store:
        result = checking.check(store, key, token)
    if as_json:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False))
        raise typer.Exit(0 if result.current else LeaseLost.exit_code)
    if not result.current:
        raise checking.not_current(result)
    typer.echo(f"{result.expires_in:.3f}")


@app.command()
def sweep(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Only count what would be removed."),
    as_json: bool = typer.Option(False, "--json", help='Print {"removed": N}.'),
) -> None:
    """Remove expired leases left in the store (fencing counters are kept)."""
    g: Globals = ctx.obj
    with g.open_store() as store:
        removed = store.sweep(dry_run=dry_run)
    if as_json:
        typer.echo(json.dumps({"removed": removed}))
    else:
        verb = "would remove" if dry_run else "removed"
        typer.echo(f"{verb} {removed} expired lease{'' if removed == 1 else 's'}")


@app.command()
def release(
    ctx: typer.Context,
    key: str = typer.Argument(..., metavar="KEY", help="The lock's name."),
    force: bool = typer.Option(False, "--force", help="Required: this breaks a live lease."),
    token: int | None = typer.Option(
        None, "--token", metavar="T", help="Break only the lease with fencing token T."
    ),
) -> None:
    """Break the lease on KEY (ops): its holder terminates its command and lets go at once;
    waits for that, freeing the lease anyway after 10s."""
    g: Globals = ctx.obj
    validate_key(key)
    if not force:
        raise UsageError("release breaks whoever holds the lock; confirm with --force")
    from tasklock_cli.breaking import LET_GO_TIMEOUT_S, break_and_wait

    with g.open_store() as store:
        outcome = break_and_wait(store, key, token)
    if outcome.broken is None:
        typer.echo(
            f"{key} was not held" if token is None else f"{key} is not held with token {token}"
        )
        return
    from tasklock_cli.lease import describe_holder

    broke = f"broke the lease on {key} held by {describe_holder(outcome.broken)}"
    if outcome.let_go_after is not None:
        typer.echo(f"{broke}; the holder let go after {outcome.let_go_after:.2f}s")
    else:
        typer.echo(
            f"{broke}; the holder did not answer within {LET_GO_TIMEOUT_S:g}s,"
            " so the lease was freed anyway"
        )


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
        store.init_schema()
        typer.echo(f"schema ready on {store.display_url}")


@app.command()
def doctor(ctx: typer.Context) -> None:
    """Check the store: reachable, schema, round-trip time, clock skew."""
    from tasklock_cli import render

    g: Globals = ctx.obj
    config_file = g.config.path
    with g.open_store() as store:
        checks = store.doctor()
    render.doctor_report(str(config_file) if config_file else "none (built-in defaults)", checks)
    failed = [check for check in checks if not check.ok]
    if any(check.name == "reachable" for check in failed):
        raise typer.Exit(StoreUnavailable.exit_code)
    if failed:
        raise typer.Exit(78)


# -- entry point ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> NoReturn:
    _exit_now(run_cli(argv))


def run_cli(argv: list[str] | None = None) -> int:
    """The whole command line, returning its exit code (main exits with it)."""
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else argv
    try:
        code = command.main(args=args, prog_name="tasklock", standalone_mode=False)
    except TasklockError as exc:
        return _fail(str(exc), exc.exit_code, args)
    except _CliException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `tasklock`: the help, as usage
            sys.stderr.write(exc.format_message() + "\n")
            return 2
        return _fail(exc.format_message(), getattr(exc, "exit_code", 2), args)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        return _fail("aborted", 130, args)
    except KeyboardInterrupt:
        return 130
    finally:
        stop_spinners()  # whatever ended the run, the terminal gets its cursor back
    return code if isinstance(code, int) else 0


def _fail(message: str, code: int, args: list[str]) -> int:
    details = traceback.format_exc() if _verbose_traceback else None
    # The parsed option where there is one; a subcommand that failed to parse may still
    # carry --log-format json after it, which argv shows.
    if "json" in (_log_format, _log_format_in(args)):
        record: dict[str, object] = {
            "event": "error",
            "code": code,
            "message": message,
            "ts": now_rfc3339(),
        }
        if details:
            record["traceback"] = details
        sys.stderr.write(json.dumps(record, ensure_ascii=False) + "\n")
        return code
    if details:
        sys.stderr.write(details)
    sys.stderr.write(f"tasklock: error: {message}\n")
    return code


def _log_format_in(args: list[str]) -> str:
    """The --log-format asked for on a command line that did not parse (the last one wins)."""
    found = "text"
    for index, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--log-format" and index + 1 < len(args):
            found = args[index + 1]
        elif arg.startswith("--log-format="):
            found = arg.split("=", 1)[1]
    return found


def _exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown of every imported module, which costs 10 ms
    (SQLite) to 40 ms (PostgreSQL, Redis) per run and keeps a CPU busy right when the next
    waiter starts. Every store is closed and every thread joined or abandoned by now; only
    the standard streams may hold buffered output."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: the reader is gone
            stream.flush()
    os._exit(code)
