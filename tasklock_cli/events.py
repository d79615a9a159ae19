"""Events and messages on stderr, as text for people or JSON lines for machines."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import TextIO

from tasklock_cli.stores.base import rfc3339

QUIET, NORMAL, VERBOSE = -1, 0, 1

# The verbosity at which each event shows in text; JSON lines show every event unless quiet.
_TEXT_LEVEL = {
    "lost": QUIET,
    "conflict": NORMAL,
    "waiting": NORMAL,
    "acquired": VERBOSE,
    "released": VERBOSE,
    "renewed": VERBOSE,
}


class EventLog:
    def __init__(
        self, log_format: str = "text", verbosity: int = NORMAL, stream: TextIO | None = None
    ) -> None:
        self.log_format = log_format
        self.verbosity = verbosity
        self._stream = stream

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
                "ts": rfc3339(datetime.now(timezone.utc)),
                **fields,
            }
            self._write(json.dumps(record, ensure_ascii=False, default=str))
        elif self.verbosity >= _TEXT_LEVEL[event]:
            prefix = "tasklock: error: " if event == "lost" else "tasklock: "
            self._write(prefix + message)

    def error(self, message: str) -> None:
        """Errors are one plain line in either format, as the contract has it."""
        self._write(f"tasklock: error: {message}")

    def debug(self, message: str) -> None:
        if self.verbosity >= VERBOSE and self.log_format == "text":
            self._write(f"tasklock: {message}")

    def _write(self, line: str) -> None:
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr closed or a broken pipe must never take the lock's safety with it
