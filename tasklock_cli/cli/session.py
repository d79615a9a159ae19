"""What every command shares, without the CLI framework: the global options, the store and
config they select, and the one boundary where errors become a line on stderr and an exit
code. Both the typer command line (cli.py) and the fast `run` parser (fastrun.py) use it."""

from __future__ import annotations

import io  # (loaded by the interpreter's start already: sys.stdout is one)
import os
import sys

from tasklock_cli.errors import UsageError
from tasklock_cli.events import NORMAL
from tasklock_cli.events import QUIET
from tasklock_cli.events import VERBOSE
from tasklock_cli.events import EventLog
from tasklock_cli.util import suppressed
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import replace

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

    from tasklock_cli.config.file import Config


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

    def checked(self) -> GlobalFlags:
        if self.verbose and self.quiet:
            raise UsageError("-v and -q exclude each other")
        return self


class ErrorStyle:
    """How the error boundary writes: set as soon as the options are known."""

    traceback = False
    #: The parsed --log-format; an error before it is known scans argv for it.
    log_format: str | None = None


class Globals:
    def __init__(self, flags: GlobalFlags):
        log_format = flags.log_format or "text"
        if log_format not in ("text", "json"):
            raise UsageError(f"invalid --log-format {log_format!r} (text or json)")
        ErrorStyle.traceback = flags.verbose > 0
        ErrorStyle.log_format = log_format
        self.store_flag = flags.store
        self.config_flag = flags.config
        verbosity = QUIET if flags.quiet else VERBOSE if flags.verbose else NORMAL
        self.events = EventLog(log_format, verbosity)
        self._config: Config | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            from tasklock_cli.config.file import load_config

            self._config = load_config(self.config_flag)
        return self._config

    def store_url(self) -> str:
        from tasklock_cli.config.file import resolve_store_url
        from tasklock_cli.stores.urls import default_store_url

        return resolve_store_url(self.store_flag, self.config, default_store_url)

    def store_config_file(self) -> str | None:
        """The config file (absolute) when the store URL came from it, else None."""
        from tasklock_cli.config.file import store_url_source

        return store_url_source(self.store_flag, self.config)

    def open_store(self):
        from tasklock_cli.errors import ConfigError
        from tasklock_cli.stores import open_store

        url = self.store_url()
        try:
            return open_store(url)
        except (ConfigError, UsageError) as exc:  # a URL that can never work
            from tasklock_cli.config.file import store_from_file
            from tasklock_cli.config.file import store_setting_error

            if not store_from_file(self.store_flag, self.config):
                raise
            raise store_setting_error(self.config, f"is not usable: {exc}") from exc


def fail(message: str, code: int, args: list[str]) -> int:
    """Report an error as the contract says (one line, or one JSON object), return ``code``."""
    details = None
    if ErrorStyle.traceback:
        import traceback

        details = traceback.format_exc()
    # The parsed option where there is one; a subcommand that failed to parse may still
    # carry --log-format json after it, which argv shows.
    from tasklock_cli.util.sanitize import json_text
    from tasklock_cli.util.sanitize import safe

    if "json" in (ErrorStyle.log_format, log_format_in(args)):
        from tasklock_cli.events import now_rfc3339

        record: dict[str, object] = {
            "event": "error",
            "code": code,
            "message": message,
            "ts": now_rfc3339(),
        }
        if details:
            record["traceback"] = details
        sys.stderr.write(json_text(record) + "\n")
        return code
    if details:
        from tasklock_cli.util.sanitize import safe_lines

        sys.stderr.write(safe_lines(details))
    sys.stderr.write(f"tasklock: error: {safe(message)}\n")
    return code


def log_format_in(args: list[str]) -> str:
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


def exit_now(code: int) -> NoReturn:
    """Exit without the interpreter's teardown of every imported module, which costs 10 ms
    (SQLite) to 40 ms (PostgreSQL, Redis) per run and keeps a CPU busy right when the next
    waiter starts. Every store is closed and every thread joined or abandoned by now; only
    the standard streams may hold buffered output: output that cannot be written now is
    an error (78), never a silent success."""
    from tasklock_cli.errors import OutputFailed

    try:
        with suppressed(OSError, ValueError):  # a closed pipe: the reader is gone
            if sys.stdout is not None:
                sys.stdout.flush()
    except OutputFailed as exc:
        code = fail(str(exc), exc.exit_code, [])
    with suppressed(OSError, ValueError):
        sys.stderr.flush()
    os._exit(code)


def checked_standard_streams() -> None:
    """Standard output whose write failures are ``OutputFailed`` (one line, 78), not a
    traceback; and no standard descriptor left closed.

    A closed fd 0, 1 or 2 gets ``/dev/null``, so that no file tasklock opens later (a
    SQLite store!) becomes fd 1 and receives the output. Output to a stdout that was
    closed is an error all the same."""
    closed = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one

    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    errors = getattr(sys.stdout, "errors", None) or "strict"
    raw = _Stdout(closed=1 in closed)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(raw), encoding, errors, line_buffering=raw.isatty()
    )


class _Stdout(io.RawIOBase):
    """fd 1 as a raw binary stream whose failures are ``OutputFailed``, raised once: the
    rest is dropped (the buffer above would otherwise raise it again at the exit's flush,
    a second error line). A closed pipe stays a BrokenPipeError (the reader is gone)."""

    def __init__(self, closed: bool) -> None:
        super().__init__()
        self._closed_at_start = closed
        self._failed = False

    def write(self, data: bytes) -> int:  # type: ignore[override]
        # (ignore: typeshed's RawIOBase takes its own Buffer alias; the writer passes bytes
        # or a memoryview, which os.write takes alike)
        from tasklock_cli.errors import OutputFailed

        if self._failed:
            return len(data)
        try:
            if self._closed_at_start:
                raise OutputFailed("it was closed")
            try:
                return os.write(1, data)
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise OutputFailed(exc.strerror or str(exc)) from None
        except OutputFailed:
            self._failed = True
            raise

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        return 1

    def isatty(self) -> bool:
        return not self._closed_at_start and os.isatty(1)
