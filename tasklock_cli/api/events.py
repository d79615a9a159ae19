"""``Locks.subscribe``: the CLI's events (``--log-format json``) handed to callbacks."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from tasklock_cli.events import NORMAL
from tasklock_cli.events import EventLog
from tasklock_cli.util.listeners import Listeners
from tasklock_cli.util.sanitize import json_text

Subscriber = Callable[[dict[str, object]], object]


class Subscribers(EventLog):
    """An EventLog whose JSON lines go to callbacks, as the objects they encode: each
    subscriber gets the same dicts a `--log-format json` run prints. A subscriber that
    raises is ignored (the lock's safety does not depend on it)."""

    def __init__(self) -> None:
        super().__init__("json", NORMAL)
        self._subscribers: Listeners[Subscriber] = Listeners()

    def add(self, callback: Subscriber) -> Callable[[], None]:
        """Hand ``callback`` each event from now on; returns what stops that."""
        return self._subscribers.add(callback)

    def _write_json(self, record: dict[str, object]) -> None:
        subscribers = self._subscribers.snapshot()
        if not subscribers:
            return
        shown = json.loads(json_text(record, default=str))
        for callback in subscribers:
            with contextlib.suppress(Exception):
                callback(dict(shown))
