"""Waiting on file descriptors: readable yet, or block until one is."""

from __future__ import annotations

import select
import time


def wait_readable(fds: list[int | None], timeout: float) -> list[int]:
    """Block until one of ``fds`` (None entries skipped) is readable or ``timeout`` seconds
    pass; the readable ones (none are read). Without fds it just sleeps."""
    watched = [fd for fd in fds if fd is not None]
    seconds = max(0.0, timeout)
    if not watched:
        time.sleep(seconds)
        return []
    readable, _, _ = select.select(watched, [], [], seconds)
    return readable


def fd_readable(fd: int | None) -> bool:
    """True when ``fd`` has something to read right now (nothing is read)."""
    return fd is not None and bool(wait_readable([fd], 0))
