"""The `tasklock` entry point: `run` through the fast parser, the rest through typer.

Nothing of tasklock's own is imported at the top (only built-in modules), so that
`tasklock --version` and the start of every `run` pay only for what they use (typer costs
about 90 ms of a start).
"""

from __future__ import annotations

import gc
import os
import sys

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn


def main(argv: list[str] | None = None) -> NoReturn:
    """Parse ``argv`` (default: the process's), run it and exit with its code."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        print_version()
    # No garbage collection while modules are imported: they make no garbage, and the
    # collector's passes over them cost `run` ~2.5 ms. Back on once the run's store is open
    # (run.command), at once for every other command.
    gc.disable()
    from tasklock_cli.util import imports

    imports.install()  # tasklock's modules with less of importlib's search (util.imports)
    import tasklock_cli.util as util
    from tasklock_cli.cli.argv import run_args
    from tasklock_cli.cli.session import checked_standard_streams
    from tasklock_cli.cli.session import exit_now
    from tasklock_cli.errors import UsageError

    util.own_process = True  # (a program using the Python API never comes here)
    checked_standard_streams()
    try:
        args = run_args(args)
    except UsageError as exc:
        from tasklock_cli.cli.session import fail

        exit_now(fail(str(exc), exc.exit_code, args))
    from tasklock_cli.cli.fastrun import parse
    from tasklock_cli.cli.fastrun import run_fast

    parsed = parse(args)
    if parsed is not None:
        exit_now(run_fast(parsed, args))
    gc.enable()
    from tasklock_cli.cli.app import run_cli

    exit_now(run_cli(args))


def print_version() -> NoReturn:
    """`tasklock --version` alone, printed as typer's ``--version`` prints it, without
    typer; with other words it goes through typer (``--version`` is eager there). Ends as
    every command does, without the interpreter's teardown (see ``session.exit_now``)."""
    from tasklock_cli import __version__

    line = f"tasklock {__version__}\n".encode()
    try:
        written = os.write(1, line)  # (fd 1 itself: a closed one fails, as a full disk)
    except BrokenPipeError:  # a closed pipe: the reader is gone, as everywhere
        os._exit(0)
    except OSError as exc:
        written, reason = 0, exc.strerror or str(exc)
    else:
        reason = "short write"
    if written != len(line):  # (the one line `session.fail` would print, without its imports)
        message = f"tasklock: error: cannot write the output to standard output: {reason}\n"
        try:  # noqa: SIM105 - not contextlib.suppress: contextlib costs ~1 ms of this start
            os.write(2, message.encode())
        except OSError:
            pass
        os._exit(78)
    os._exit(0)
