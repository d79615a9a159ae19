"""Pieces of `tasklock doctor` shared by the stores."""

from __future__ import annotations

import time
from collections.abc import Callable

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.model import StoreCheck

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: A store clock further than this from ours is worth a warning (times shown look off).
CLOCK_WARN_S = 1.0


def clock_check(whose: str, offset: float, uncertainty: float, decides: str) -> StoreCheck:
    """The ``clock`` line: ``offset`` seconds of the store's clock from ours, measured to
    within ``uncertainty`` seconds; ``decides`` says what the store's clock is used for."""
    detail = (
        f"{whose} clock is {abs(offset) * 1000:.0f} ms "
        f"{'ahead of' if offset >= 0 else 'behind'} this machine's "
        f"(±{uncertainty * 1000:.1f} ms); {decides}"
    )
    if abs(offset) - uncertainty > CLOCK_WARN_S:
        detail += "; times shown by peek/list will look off on this machine"
        return StoreCheck("clock", True, detail, warning=True)
    return StoreCheck("clock", True, detail)


def warning(name: str, detail: str) -> StoreCheck:
    return StoreCheck(name, True, detail, warning=True)


def closest_clock_offset(read_clock: Callable[[], float]) -> tuple[float, float]:
    """(the store's clock - ours, round trip) in seconds: of three readings of the store's
    clock (seconds since 1970, from ``read_clock``), the one with the shortest round trip."""
    best: tuple[float, float] | None = None
    for _ in range(3):
        before, started = time.time(), time.perf_counter()
        server = read_clock()
        elapsed = time.perf_counter() - started
        offset = server - (before + elapsed / 2)
        if best is None or elapsed < best[1]:
            best = (offset, elapsed)
    assert best is not None
    return best


def reachable_checks(
    display_url: str, probe: Callable[[], dict[str, Any]]
) -> tuple[list[StoreCheck], dict[str, Any] | None]:
    """A SQL server's first lines, ``store`` and ``reachable``, and what ``probe`` found
    (None when it failed: the rest cannot be looked at). ``probe`` gives the round trip of
    a ``SELECT 1`` as "rtt" (s)."""
    checks = [StoreCheck("store", True, display_url)]
    try:
        found = probe()
    except TasklockError as exc:
        checks.append(StoreCheck("reachable", False, str(exc)))
        return checks, None
    rtt_ms = found["rtt"] * 1000
    checks.append(StoreCheck("reachable", True, f"SELECT 1 round trip {rtt_ms:.1f} ms"))
    return checks, found


def server_clock_check(offset: float, elapsed: float) -> StoreCheck:
    """A SQL server's ``clock`` line, from ``closest_clock_offset``'s reading."""
    return clock_check("the server's", offset, elapsed / 2, "the server's clock decides expiry")
