"""An injected clock and SQLite stores on it, for unit tests of the lease engine's timing
without sleeping."""

from __future__ import annotations

import signal

from tasklock_cli.run.waiter import Waiter
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.sqlite.store import SQLiteStore


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SlowStore(SQLiteStore):
    """A real SQLite store on a fake clock whose replies take ``reply_delay`` of that clock,
    and whose waits advance the clock instead of sleeping (so it signals no releases:
    waiters poll it, backing off to POLL_CEILING_S)."""

    signals_release = False

    def __init__(self, path, clock: FakeClock, reply_delay: float = 0.0) -> None:
        super().__init__(path, clock=clock, wall_clock=clock)
        self.fake = clock
        self.reply_delay = reply_delay
        self.waits: list[float] = []
        self.stopped_waiting: list[str] = []

    def acquire(self, *args, **kwargs):
        lease = super().acquire(*args, **kwargs)
        self.fake.advance(self.reply_delay)
        return lease

    def renew(self, *args, **kwargs):
        lease = super().renew(*args, **kwargs)
        self.fake.advance(self.reply_delay)
        return lease

    def wait_for_release(self, key: str, timeout: float, wake_fd: int | None = None) -> None:
        self.waits.append(timeout)
        self.fake.advance(timeout)

    def stop_waiting(self, key: str) -> None:
        self.stopped_waiting.append(key)


class SignallingSlowStore(SlowStore):
    signals_release = True


class PlaceKeepingSlowStore(SignallingSlowStore):
    waits_keep_places = True


class SignalledStore(SlowStore):
    """Delivers a 'signal' (calls the waiter's interrupt, as the supervisor's handler does)
    inside the store call named by ``during``."""

    def __init__(self, path, clock: FakeClock, during: str) -> None:
        super().__init__(path, clock)
        self.during = during
        self.waiter: Waiter | None = None

    def acquire(self, *args, **kwargs):
        lease = super().acquire(*args, **kwargs)
        if self.during == "acquire" and self.waiter is not None:
            self.waiter.interrupt(signal.SIGTERM)
        return lease

    def wait_for_release(self, key: str, timeout: float, wake_fd: int | None = None) -> None:
        super().wait_for_release(key, timeout)
        if self.during == "wait":
            assert self.waiter is not None
            self.waiter.interrupt(signal.SIGTERM)


HOLDER = Holder(host="h", pid=1, user="u", command=["true"])
