"""Forced release: break leases, then wait for their holders to let go (or free them anyway)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from dataclasses import field

from tasklock_cli.stores.base import LeaseInfo
from tasklock_cli.stores.base import Store

#: How long ``release --force`` waits for the holders of broken leases to let go.
LET_GO_TIMEOUT_S = 10.0
#: How often it looks meanwhile.
LET_GO_POLL_S = 0.02


@dataclass(frozen=True)
class BreakOutcome:
    """What ``break_and_wait`` did: ``broken`` is empty when no live lease matched;
    ``let_go_after`` is None when a holder did not let go in time and its lease was freed
    by force."""

    broken: list[LeaseInfo] = field(default_factory=list)
    let_go_after: float | None = None


def break_and_wait(
    store: Store, key: str, token: int | None = None, timeout: float = LET_GO_TIMEOUT_S
) -> BreakOutcome:
    """Break the live leases on ``key`` (every slot's, or the one with fencing ``token``),
    wait until none of them is live any more, at most ``timeout`` seconds, then free by
    force those still live."""
    broken = store.break_lease(key, token)
    if not broken:
        return BreakOutcome()
    tokens = {info.fencing_token for info in broken}
    started = time.monotonic()
    deadline = started + timeout
    while still_held := _still_held(store, key, tokens):
        left = deadline - time.monotonic()
        if left <= 0:
            freed = [store.force_release(key, held) for held in sorted(still_held)]
            if not any(freed):
                break  # they let go at the last moment
            return BreakOutcome(broken, None)
        time.sleep(min(LET_GO_POLL_S, left))
    return BreakOutcome(broken, time.monotonic() - started)


def _still_held(store: Store, key: str, tokens: set[int]) -> set[int]:
    return {info.fencing_token for info in store.holders(key)} & tokens
