"""The lease a ``with locks.lock(...)`` block holds, as the block sees it, and
``current_lease()``: the innermost one held by this thread or task."""

from __future__ import annotations

import threading
from contextvars import ContextVar
from datetime import datetime

from tasklock_cli.api.hold import LeaseHold
from tasklock_cli.errors import LossKind

#: The leases held by this thread or task, innermost last (a ContextVar: each thread and
#: each asyncio task sees its own).
_HELD: ContextVar[tuple[Lease, ...]] = ContextVar("tasklock_held", default=())


class Lease:
    """A lease held by a ``with``/``async with locks.lock(...)`` block.

    ``fencing_token`` is strictly greater than every token issued before for the key on
    this store, CLI runs' included: pass it with every write the lock protects, so that
    a holder that lost the lease (paused, cut off) is refused. ``lost`` is set the moment
    the lease is lost; a sync block is never interrupted, so long work should look at it
    (or pass it on as a cancellation flag) between steps."""

    def __init__(self, hold: LeaseHold) -> None:
        self._hold = hold
        lease = hold.keeper.lease
        assert lease is not None, "a Lease is made once the lock is held"
        self.key: str = hold.options.key
        self.fencing_token: int = lease.fencing_token
        self.slot: int = lease.slot
        self.tokens: dict[str, int] = hold.holding.tokens()
        self.lost: threading.Event = hold.lost

    @property
    def expires_at(self) -> datetime:
        """When the lease runs out on the store, as of its last renewal (UTC)."""
        expires_at = self._hold.expires_at
        assert expires_at is not None
        return expires_at

    @property
    def detected_by(self) -> str | None:
        """How the lease was lost (``rejected``, ``unreachable``, ...); None while held."""
        loss = self._hold.loss
        return None if loss is None else str(loss.detected_by)

    def check(self) -> float:
        """Seconds left of the lease on the store (one round trip); raises LockLost when it
        is no longer current (lost, broken, expired or taken)."""
        if self._hold.loss is not None:
            raise self._hold.lost_error()
        left = self._hold.time_left()
        if left is None:
            self._hold.lose(LossKind.REJECTED, "the store no longer has the lease (check)")
            raise self._hold.lost_error()
        return left

    def __repr__(self) -> str:
        return f"Lease(key={self.key!r}, fencing_token={self.fencing_token}, slot={self.slot})"


def current_lease() -> Lease | None:
    """The innermost lease held by this thread or asyncio task; None outside any."""
    held = _HELD.get()
    return held[-1] if held else None


def push(lease: Lease) -> object:
    """``lease`` is now this thread's or task's innermost; what ``pop`` takes."""
    return _HELD.set((*_HELD.get(), lease))


def pop(token: object) -> None:
    _HELD.reset(token)  # type: ignore[arg-type]
