"""The client's clock for lease deadlines: monotonic and counting suspended time too."""

from __future__ import annotations

import time
from collections.abc import Callable

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
