"""The client's clock for lease deadlines: monotonic and counting suspended time too."""

from __future__ import annotations

import time

TYPE_CHECKING = False  # (not typing's: a run does without importing it)
if TYPE_CHECKING:
    from collections.abc import Callable

    from tasklock_cli.util.listeners import Listeners

    #: A clock: seconds, only ever forward (not at run time: collections.abc would import
    #: the collections package, ~0.5 ms of a start; annotations are never evaluated).
    Clock = Callable[[], float]


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _pick_clock() -> Clock:
    # CLOCK_BOOTTIME is CLOCK_MONOTONIC plus time spent suspended: a laptop lid or a VM
    # freeze must not make the wrapper believe it still holds a lease the store expired.
    try:
        _boottime()
    except (AttributeError, OSError):
        return time.monotonic
    return _boottime


monotonic: Clock = _pick_clock()


class SystemClock:
    """The real clocks as one object: ``clock()`` is ``monotonic``, ``wall()`` the epoch
    seconds of ``time.time``. What an in-process store (``memory://``) keeps time by."""

    def __call__(self) -> float:
        return monotonic()

    def wall(self) -> float:
        return time.time()


class ManualClock(SystemClock):
    """A clock that moves only when told (``advance``), for tests of code that holds locks.

    ``clock()`` is a monotonic reading, ``wall()`` epoch seconds; both move together, in
    one step per ``advance``. Code that waits on it (a lease's watcher) registers a wake-up
    with ``on_advance`` so that a step is seen at once."""

    def __init__(self, start: float = 0.0, wall: float | None = None) -> None:
        import _thread

        self._now = start
        self._wall_at_start = time.time() if wall is None else wall
        self._start = start
        self._lock = _thread.allocate_lock()
        from tasklock_cli.util.listeners import Listeners

        self._listeners: Listeners[Callable[[], None]] = Listeners()

    def __call__(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall_at_start + (self._now - self._start)

    def advance(self, by: str | float) -> None:
        """Move time on by ``by`` (a duration as the CLI reads it, or seconds), in one step:
        whatever expires inside the step has expired."""
        from tasklock_cli.util.durations import parse_duration

        seconds = parse_duration(by, allow_inf=False) if isinstance(by, str) else float(by)
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward (advance({by!r}))")
        with self._lock:
            self._now += seconds
        for listener in self._listeners.snapshot():
            listener()

    def on_advance(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after every ``advance``; returns what stops that."""
        return self._listeners.add(listener)
