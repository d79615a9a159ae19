"""Forced release: break a lease, then wait for its holder to let go (or free it anyway)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tasklock_cli.stores.base import LeaseInfo
from tasklock_cli.stores.base import Store

#: How long ``release --force`` waits for the holder of a broken lease to let go.
LET_GO_TIMEOUT_S = 10.0
#: How often it looks meanwhile.
LET_GO_POLL_S = 0.02


@dataclass(frozen=True)
class BreakOutcome:
    """What ``break_and_wait`` did: ``broken`` is None when no live lease matched;
    ``let_go_after`` is None when the holder did not let go in time and the lease was
    freed by force."""

    broken: LeaseInfo | None
    let_go_after: float | None = None


def break_and_wait(
    store: Store, key: str, token: int | None = None, timeout: float = LET_GO_TIMEOUT_S
) -> BreakOutcome:
    """Break the live lease on ``key`` (the one with fencing ``token``, when given), wait
    until no live lease with its fencing token remains, at most ``timeout`` seconds, then
    free it by force if it still does."""
    broken = store.break_lease(key, token)
    if broken is None:
        return BreakOutcome(None)
    started = time.monotonic()
    deadline = started + timeout
    while _still_held(store, broken):
        left = deadline - time.monotonic()
        if left <= 0:
            if store.force_release(key, broken.fencing_token) is None:
                break  # it let go at the last moment
            return BreakOutcome(broken, None)
        time.sleep(min(LET_GO_POLL_S, left))
    return BreakOutcome(broken, time.monotonic() - started)


def _still_held(store: Store, broken: LeaseInfo) -> bool:
    current = store.peek(broken.key)
    return current is not None and current.fencing_token == broken.fencing_token
