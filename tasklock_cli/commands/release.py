"""Forced release: break leases, then wait for their holders to let go.

A holder that does not let go in time keeps its key, marked broken, until its lease runs
out on the store's clock (a lock-delay, as Consul's): by then its guard has ended its
command's tree, wherever the holder is. Only a holder that the store can tell is gone (its
processes ended, on this machine) is freed at once."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timezone

from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import LeaseInfo

#: How long ``release --force`` waits for the holders of broken leases to let go.
LET_GO_TIMEOUT_S = 10.0
#: Tests shorten the wait through this variable (seconds); users cannot rely on it.
LET_GO_TIMEOUT_ENV = "TASKLOCK_TEST_LET_GO_TIMEOUT"
#: How often it looks meanwhile.
LET_GO_POLL_S = 0.02


@dataclass(frozen=True)
class BreakOutcome:
    """What ``break_and_wait`` did: ``broken`` is empty when no live lease matched;
    ``let_go_after`` is None when a holder did not let go in time: then its lease stays,
    broken, until ``free_at`` (the store's clock)."""

    broken: list[LeaseInfo] = field(default_factory=list)
    let_go_after: float | None = None
    free_at: datetime | None = None
    #: How the key came free: "let go" (its holders released), "ended" (a lease kept by
    #: --hold-at-least after its command ended: nobody was under it) or "ran out" (a lease
    #: nobody answered for reached its expiry within the wait).
    how: str = "let go"

    @property
    def freed(self) -> bool:
        return self.let_go_after is not None or not self.broken


def let_go_timeout() -> float:
    """LET_GO_TIMEOUT_S, or the test suite's shorter wait."""
    try:
        return float(os.environ[LET_GO_TIMEOUT_ENV])
    except (KeyError, ValueError):
        return LET_GO_TIMEOUT_S


def break_and_wait(
    store: Store,
    key: str,
    token: int | None = None,
    timeout: float = LET_GO_TIMEOUT_S,
    by: Holder | None = None,
) -> BreakOutcome:
    """Break the live leases on ``key`` (every slot's, or the one with fencing ``token``)
    in the name of ``by``, and wait until none of them is live any more, at most
    ``timeout`` seconds. A lease whose holder is known to be gone is freed at once; one
    still live at the end is left to run out."""
    broken = store.break_lease(key, token, by)
    if not broken:
        return BreakOutcome()
    tokens = {info.fencing_token for info in broken}
    started = time.monotonic()
    deadline = started + timeout
    how = "let go"
    last_expiry: datetime | None = None
    while still_held := _still_held(store, key, tokens):
        for info in still_held:
            if store.free_if_holder_gone(key, info.fencing_token):
                how = "ended"
        left = deadline - time.monotonic()
        if left <= 0:
            still_held = _still_held(store, key, tokens)
            if not still_held:
                break  # they let go at the last moment
            return BreakOutcome(broken, None, max(info.expires_at for info in still_held))
        last_expiry = max(info.expires_at for info in still_held)
        time.sleep(min(LET_GO_POLL_S, left))
    if how == "let go" and _ran_out(last_expiry):
        how = "ran out"
    return BreakOutcome(broken, time.monotonic() - started, how=how)


def _ran_out(last_expiry: datetime | None) -> bool:
    """Whether the last expiry seen of a broken lease has passed (the store's clock and
    ours agree within the wait's poll: a lease seen live a poll ago that has now run out
    was not let go)."""
    return last_expiry is not None and last_expiry <= datetime.now(timezone.utc)


def _still_held(store: Store, key: str, tokens: set[int]) -> list[LeaseInfo]:
    return [info for info in store.holders(key) if info.fencing_token in tokens]
