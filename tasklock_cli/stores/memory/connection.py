"""The memory store's spaces: one per name, shared by every store opened on it in this
process, and what a space holds (leases by key and slot, fencing counters, queues of
waiters, the run ledger), guarded by one lock."""

from __future__ import annotations

import itertools
import threading

from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util.clock import SystemClock
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field


@dataclass
class Slot:
    """A lease as the space keeps it; ``expires`` on the space's clock."""

    owner: str
    fencing_token: int
    holder: Holder
    acquired_at: float  # wall seconds
    expires: float
    limit: int = 1
    mode: str = EXCLUSIVE
    broken: bool = False
    broken_by: dict | None = None
    kept: bool = False  # released with keep_for: its holder has gone


@dataclass
class Place:
    """A waiter's place in a key's queue, served in ``order``."""

    owner: str
    holder: Holder
    since: float  # wall seconds
    expires: float
    order: tuple[int, int, int]  # (front: below 0, -priority, arrival)
    mode: str = EXCLUSIVE
    supersede: bool = False
    superseded: bool = False
    priority: int = 0


@dataclass
class Space:
    """Everything stores opened on one ``memory://NAME`` share."""

    clock: SystemClock = field(default_factory=SystemClock)
    leases: dict[str, dict[int, Slot]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    places: dict[str, dict[str, Place]] = field(default_factory=dict)
    ledger: dict[str, dict[int, RunRecord]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lock = threading.RLock()
        self.sequence = itertools.count()
        self.use_clock(self.clock)

    def use_clock(self, clock: SystemClock) -> None:
        """Keep time by ``clock`` from now on; wall times are its readings plus one offset
        taken now (so that a lease's expiry reads the same every time)."""
        self.clock = clock
        self._wall_offset = clock.wall() - clock()

    def wall_at(self, moment: float) -> float:
        """The wall time of ``moment`` on the space's clock."""
        return moment + self._wall_offset


_SPACES: dict[str, Space] = {}
_SPACES_LOCK = threading.Lock()


def space_named(name: str) -> Space:
    """The process's space of ``name``, made on first use."""
    with _SPACES_LOCK:
        if name not in _SPACES:
            _SPACES[name] = Space()
        return _SPACES[name]


def drop_space(name: str) -> None:
    """Forget the space of ``name`` (a test's teardown)."""
    with _SPACES_LOCK:
        _SPACES.pop(name, None)
