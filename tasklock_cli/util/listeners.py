"""Callbacks that threads add and remove while another calls them (not on ``run``'s path:
``typing`` is not)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic
from typing import TypeVar

_Listener = TypeVar("_Listener")


class Listeners(Generic[_Listener]):
    """Callbacks added and removed from any thread; ``snapshot()`` is what to call, outside
    the lock (a callback may add or remove one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[_Listener] = []

    def add(self, item: _Listener) -> Callable[[], None]:
        """Add ``item``; returns what removes it (once; a second call does nothing)."""
        with self._lock:
            self._items.append(item)

        def remove() -> None:
            with self._lock:
                if item in self._items:
                    self._items.remove(item)

        return remove

    def snapshot(self) -> list[_Listener]:
        with self._lock:
            return list(self._items)
