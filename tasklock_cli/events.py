"""Events and messages on stderr, as text for people or JSON lines for machines."""

from __future__ import annotations

import os
import sys

from tasklock_cli.util import suppressed
from tasklock_cli.util.sanitize import json_text
from tasklock_cli.util.sanitize import safe
from tasklock_cli.util.times import rfc3339
from tasklock_cli.util.times import utc_now

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO

    from rich.status import Status

QUIET, NORMAL, VERBOSE = -1, 0, 1

# The verbosity at which each event shows in text; JSON lines show every event unless quiet.
_TEXT_LEVEL = {
    "lost": QUIET,
    "conflict": NORMAL,
    "superseded": NORMAL,
    "waiting": NORMAL,
    "acquired": VERBOSE,
    "released": VERBOSE,
    "renewed": VERBOSE,
    "orphans-terminated": VERBOSE,
    "done-already": VERBOSE,
}


#: Spinners drawn now; the entry point stops them on every way out (a signal while waiting
#: included), since a spinner hides the terminal's cursor until it is stopped.
_live_spinners: set[EventLog] = set()


def stop_spinners() -> None:
    for log in list(_live_spinners):
        log._stop_spinner()


def now_rfc3339() -> str:
    return rfc3339(utc_now())


class EventLog:
    def __init__(
        self, log_format: str = "text", verbosity: int = NORMAL, stream: TextIO | None = None
    ) -> None:
        self.log_format = log_format
        self.verbosity = verbosity
        self._stream = stream
        self._spinner: Status | None = None

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stderr

    def emit(
        self, event: str, key: str, fencing_token: int | None, message: str, **fields: object
    ) -> None:
        if self.log_format == "json":
            if self.verbosity == QUIET and event != "lost":
                return
            record = {
                "event": event,
                "key": key,
                "fencing_token": fencing_token,
                "ts": now_rfc3339(),
                **fields,
            }
            self._write_json(record)
        elif self.verbosity >= _TEXT_LEVEL[event]:
            self._stop_spinner()
            if event == "waiting" and self._start_spinner(message):
                return
            prefix = "tasklock: error: " if event == "lost" else "tasklock: "
            self._write(prefix + message)
        else:
            self._stop_spinner()

    def error(self, message: str) -> None:
        """An error the run goes on after: one line, a JSON object with --log-format json."""
        self._stop_spinner()
        if self.log_format == "json":
            record = {"event": "error", "message": message, "ts": now_rfc3339()}
            self._write_json(record)
        else:
            self._write(f"tasklock: error: {message}")

    def warning(self, message: str, **fields: object) -> None:
        """Something went wrong that changes nothing about the run's outcome."""
        if self.verbosity == QUIET:
            return
        self._stop_spinner()
        if self.log_format == "json":
            record = {"event": "warning", "message": message, "ts": now_rfc3339(), **fields}
            self._write_json(record)
        else:
            self._write(f"tasklock: warning: {message}")

    def _start_spinner(self, message: str) -> bool:
        """On a terminal, a long wait shows a spinner instead of a line (nothing extra
        when stderr is a file or a pipe)."""
        try:
            if not self.stream.isatty():
                return False
        except (AttributeError, ValueError):
            return False
        from rich.console import Console
        from rich.text import Text

        console = Console(file=self.stream, no_color=bool(os.environ.get("NO_COLOR")) or None)
        self._spinner = console.status(Text(safe(f"tasklock: {message}…")))
        _live_spinners.add(self)
        self._spinner.start()
        return True

    def _stop_spinner(self) -> None:
        spinner, self._spinner = self._spinner, None
        _live_spinners.discard(self)
        if spinner is not None:
            with suppressed(OSError, ValueError):  # the terminal may be gone
                spinner.stop()

    def debug(self, message: str) -> None:
        if self.verbosity >= VERBOSE and self.log_format == "text":
            self._write(f"tasklock: {message}")

    def _write_json(self, record: dict) -> None:
        """One JSON line, escaped by ``json_text`` (``safe`` would make it invalid JSON)."""
        self._write_line(json_text(record, default=str))

    def _write(self, line: str) -> None:
        """One line: a text message escaped whole (its key, note, holder may be anyone's)."""
        self._write_line(safe(line))

    def _write_line(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed or a broken pipe must never take the lock's safety with it
